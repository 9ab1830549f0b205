"""A built-in synthetic instruction corpus: no download, deterministic for a seed.

It mixes low-entropy tasks (one right answer: arithmetic, copying, sorting, counting, reversing,
capitalising) with high-entropy ones (open lists, short descriptions, free sentences), so that the teacher's
sampling temperature changes what the KD data looks like — the property the paper's study rests on.
A separate family of arithmetic word problems plays GSM8K's role as the out-of-domain test set.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from specray.config.vocabulary import IN_DOMAIN
from specray.data.examples import Example

Task = tuple[str, str, str]  # (instruction, input, output)

FRUITS = [
    "apple",
    "pear",
    "plum",
    "grape",
    "mango",
    "lemon",
    "cherry",
    "peach",
    "melon",
    "banana",
    "kiwi",
    "lime",
    "fig",
    "orange",
]
ANIMALS = [
    "cat",
    "dog",
    "fox",
    "owl",
    "horse",
    "mouse",
    "rabbit",
    "tiger",
    "bear",
    "wolf",
    "duck",
    "goat",
    "sheep",
    "frog",
    "lion",
]
COLORS = [
    "red",
    "blue",
    "green",
    "yellow",
    "black",
    "white",
    "orange",
    "purple",
    "pink",
    "brown",
    "gray",
    "gold",
]
TOOLS = ["hammer", "saw", "drill", "knife", "rope", "ladder", "brush", "shovel", "wrench", "needle"]
SPORTS = ["tennis", "soccer", "golf", "chess", "rugby", "hockey", "boxing", "rowing", "cycling", "running"]
CATEGORIES = {"fruits": FRUITS, "animals": ANIMALS, "colors": COLORS, "tools": TOOLS, "sports": SPORTS}
NOUNS = [
    "river",
    "forest",
    "city",
    "garden",
    "house",
    "road",
    "mountain",
    "lake",
    "market",
    "school",
    "kitchen",
    "bridge",
]
ADJECTIVES = [
    "quiet",
    "busy",
    "old",
    "small",
    "large",
    "bright",
    "dark",
    "warm",
    "cold",
    "green",
    "calm",
    "wide",
    "narrow",
]
VERBS = ["looks", "feels", "seems", "is"]
WORDS = sorted(set(FRUITS + ANIMALS + COLORS + NOUNS))
NAMES = [
    "Anna",
    "Ben",
    "Carl",
    "Dana",
    "Eli",
    "Fay",
    "Gus",
    "Hana",
    "Ivan",
    "Jill",
    "Kim",
    "Leo",
    "Mia",
    "Ned",
    "Omar",
    "Pia",
]
ITEMS = ["apples", "books", "pens", "coins", "cards", "stamps", "shells", "marbles", "cookies", "stickers"]
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _arithmetic(rng: random.Random) -> Task:
    a, b = rng.randint(1, 20), rng.randint(1, 20)
    op, symbol, result = rng.choice([("Add", "+", a + b), ("Subtract", "-", a - b), ("Multiply", "*", a * b)])
    instruction = rng.choice([f"{op} the two numbers.", f"{op} the numbers in the input."])
    return instruction, f"{a} and {b}", f"{a} {symbol} {b} = {result}"


def _copy(rng: random.Random) -> Task:
    text = " ".join(rng.sample(WORDS, rng.randint(2, 5)))
    return rng.choice(["Repeat the input exactly.", "Copy the input."]), text, text


def _sort(rng: random.Random) -> Task:
    if rng.random() < 0.5:
        numbers = rng.sample(range(1, 50), rng.randint(3, 6))
        text = ", ".join(map(str, numbers))
        return "Sort the numbers in ascending order.", text, ", ".join(map(str, sorted(numbers)))
    words = rng.sample(WORDS, rng.randint(3, 5))
    return "Sort the words in alphabetical order.", ", ".join(words), ", ".join(sorted(words))


def _count(rng: random.Random) -> Task:
    words = rng.choices(WORDS, k=rng.randint(1, 9))
    n = len(words)
    answer = f"There {'is' if n == 1 else 'are'} {NUMBER_WORDS[n]} {'word' if n == 1 else 'words'}."
    return "Count the words in the input.", " ".join(words), answer


def _reverse(rng: random.Random) -> Task:
    words = rng.sample(WORDS, rng.randint(2, 5))
    return "Reverse the order of the words.", " ".join(words), " ".join(reversed(words))


def _capitalise(rng: random.Random) -> Task:
    text = " ".join(rng.sample(WORDS, rng.randint(2, 4)))
    return "Write the input in capital letters.", text, text.upper()


def _open_list(rng: random.Random) -> Task:
    category = rng.choice(sorted(CATEGORIES))
    k = rng.randint(2, 4)
    picks = rng.sample(CATEGORIES[category], k)
    instruction = rng.choice([f"List {NUMBER_WORDS[k]} {category}.", f"Name {NUMBER_WORDS[k]} {category}."])
    return instruction, "", "\n".join(f"{i}. {item}" for i, item in enumerate(picks, 1))


def _describe(rng: random.Random) -> Task:
    noun = rng.choice(NOUNS)
    a, b = rng.sample(ADJECTIVES, 2)
    verb, when = rng.choice(VERBS), rng.choice(["morning", "evening", "rain", "sun"])
    output = rng.choice(
        [
            f"The {noun} is {a} and {b}.",
            f"{_article(a).capitalize()} {a} {noun} {verb} {b} in the {when}.",
            f"This {noun} is {a}, with {_article(b)} {b} {rng.choice(COLORS)} light.",
        ]
    )
    return f"Describe {_article(noun)} {noun} in one sentence.", "", output


def _sentence(rng: random.Random) -> Task:
    animal, noun = rng.choice(ANIMALS), rng.choice(NOUNS)
    verb = rng.choice(["runs to", "sleeps near", "walks past", "looks at", "waits by"])
    adjective = rng.choice(ADJECTIVES)
    output = f"The {adjective} {animal} {verb} the {noun}."
    if rng.random() < 0.5:
        output += f" It is {rng.choice(ADJECTIVES)}."
    return f"Write a short sentence about a {animal}.", "", output


def _word_problem(rng: random.Random) -> Task:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(2, 20), rng.randint(1, 12)
    if rng.random() < 0.5:
        question = f"{name} has {a} {item}. {name} buys {b} more. How many {item} does {name} have now?"
        output = f"{name} has {a} + {b} = {a + b} {item}. The answer is {a + b}."
    else:
        a = a + b  # never negative
        question = f"{name} has {a} {item} and gives away {b}. How many {item} are left?"
        output = f"{name} has {a} - {b} = {a - b} {item} left. The answer is {a - b}."
    return question, "", output


FAMILIES: dict[str, Callable[[random.Random], Task]] = {
    "arithmetic": _arithmetic,
    "copy": _copy,
    "sort": _sort,
    "count": _count,
    "reverse": _reverse,
    "capitalise": _capitalise,
    "open_list": _open_list,
    "describe": _describe,
    "sentence": _sentence,
    "word_problem": _word_problem,
}


def synthetic_corpus(n: int, seed: int, families: Sequence[str] | None = None) -> list[Example]:
    """`n` examples drawn uniformly over `families` (default: the in-domain ones), reproducible by seed."""
    families = tuple(families) if families is not None else IN_DOMAIN
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown or not families:
        raise ValueError(f"unknown synthetic families {unknown}; valid: {', '.join(FAMILIES)}")
    rng = random.Random(seed)
    examples = []
    for i in range(n):
        family = families[i % len(families)] if i < len(families) else rng.choice(families)
        instruction, input_text, output = FAMILIES[family](rng)
        examples.append(Example(f"synthetic-{seed}-{i}", instruction, input_text, output, family))
    return examples
