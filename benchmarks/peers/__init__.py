"""specray against what a user would otherwise pick: TRL's trainers and transformers' `model.generate`."""
