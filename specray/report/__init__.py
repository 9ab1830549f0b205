"""Figures and tables of a sweep (paper Fig. 2–6, Tables 2–3), as PNG + Markdown, readable without MLflow."""
