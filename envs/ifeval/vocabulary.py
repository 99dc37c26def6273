"""Word and phrase pools the prompt generator draws from (ours; plain common English words)."""

from __future__ import annotations

#: Keywords to include, forbid or repeat, and first words of paragraphs.
WORDS: tuple[str, ...] = (
    "river", "garden", "window", "engine", "market", "lantern", "harbor", "valley", "forest", "bridge",
    "kitchen", "signal", "planet", "ticket", "museum", "island", "letter", "pocket", "summer", "winter",
    "candle", "mirror", "silver", "ladder", "blanket", "compass", "orchard", "meadow", "village", "station",
    "teacher", "doctor", "farmer", "pilot", "author", "painter", "captain", "student", "neighbor", "stranger",
    "coffee", "bread", "apple", "honey", "pepper", "butter", "cheese", "tomato", "lemon", "carrot",
    "music", "history", "science", "energy", "weather", "journey", "balance", "freedom", "courage", "silence",
    "camera", "battery", "keyboard", "printer", "network", "software", "circuit", "rocket", "satellite", "robot",
    "budget", "profit", "contract", "invoice", "meeting", "project", "deadline", "strategy", "customer", "product",
    "mountain", "desert", "ocean", "storm", "thunder", "glacier", "canyon", "volcano", "prairie", "lagoon",
    "chapter", "poem", "novel", "story", "article", "report", "essay", "review", "diary", "recipe",
)

#: Topics that generated prompts ask about.
TOPICS: tuple[str, ...] = (
    "the history of the bicycle", "how bees make honey", "a rainy afternoon in a small town",
    "the benefits of learning a second language", "how to plan a weekend hiking trip",
    "why people keep houseplants", "the life of a lighthouse keeper", "a review of an imaginary restaurant",
    "how a public library works", "the first day at a new job", "the water cycle",
    "tips for saving money on groceries", "a letter to a future self", "how trains changed travel",
    "the rules of chess for a beginner", "why sleep matters", "a product launch for a solar lantern",
    "a short biography of an invented inventor", "how to care for a dog", "the pros and cons of remote work",
)

#: Phrases a response can be asked to end with.
END_PHRASES: tuple[str, ...] = (
    "Is there anything else I can help with?", "Any other questions?", "That is all for today.",
    "Thank you for reading.", "Let me know what you think.",
)

#: Words that open a numbered section ("Section 1").
SECTION_WORDS: tuple[str, ...] = ("Section", "SECTION", "Part", "Chapter")

#: Postscript markers.
POSTSCRIPT_MARKERS: tuple[str, ...] = ("P.S.", "P.P.S")

#: Languages a response can be asked to be in: ISO 639-1 code → English name (IFEval's set of 30).
LANGUAGES: dict[str, str] = {
    "en": "English", "es": "Spanish", "pt": "Portuguese", "ar": "Arabic", "hi": "Hindi", "fr": "French",
    "ru": "Russian", "de": "German", "ja": "Japanese", "it": "Italian", "bn": "Bengali", "uk": "Ukrainian",
    "th": "Thai", "ur": "Urdu", "ta": "Tamil", "te": "Telugu", "bg": "Bulgarian", "ko": "Korean",
    "pl": "Polish", "he": "Hebrew", "fa": "Persian", "vi": "Vietnamese", "ne": "Nepali", "sw": "Swahili",
    "kn": "Kannada", "mr": "Marathi", "gu": "Gujarati", "pa": "Punjabi", "ml": "Malayalam", "fi": "Finnish",
}
