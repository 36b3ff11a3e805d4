"""The bundled prompt set of the accuracy check.

Plain English text of different kinds (prose, code, lists, numbers, dialogue), kept
short so that prompt plus 32 generated tokens fit a small ``max_model_len``. It lives
in a module rather than a data file so that it ships with the package unchanged.
"""

PROMPTS: tuple[str, ...] = (
    "The capital of France is Paris, and the capital of Germany is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Once upon a time, in a small village by the sea, there lived an old",
    "1, 2, 3, 5, 8, 13, 21, 34,",
    "Q: What is the boiling point of water at sea level?\nA:",
    "To install the package, run the following command in your terminal:",
    "The mitochondria is the powerhouse of the cell because it",
    "Dear hiring manager, I am writing to apply for the position of",
    "SELECT name, email FROM users WHERE created_at >",
    "Ingredients: two cups of flour, one egg, a pinch of salt, and",
    "The quick brown fox jumps over the lazy dog. The lazy dog",
    "In 1969, astronauts landed on the Moon for the first time. They",
)
