"""The prompts the engine is checked against transformers on: plain text and chat turns."""

PLAIN = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "1, 2, 3, 4,",
]
CHAT = [
    "What is the boiling point of water?",
    "Write a haiku about autumn leaves.",
    "Explain in two sentences why the sky is blue, and mention Rayleigh scattering by name.",
    "hi",
]
