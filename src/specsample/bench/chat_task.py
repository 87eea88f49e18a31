"""General chat: the requests a chat server gets that are not code, one kind at a time.

Thirteen kinds, as chat benchmarks group them (MT-Bench's eight categories, with
summarisation, translation, extraction, QA and retrieval-augmented QA beside them):
writing, roleplay, reasoning, math, coding, extraction, stem, humanities,
translation, summarization, qa, math-word and rag. Each has two prompts. The short
ones are written here; the long-context ones read the standard library's module
docstrings (offline, the same on every run of a Python version): a summary of one, a
list pulled out of another, and a question about one of six documents given
together (about 2,000 tokens), where the answer is in one of them.

Prompts come kind by kind in turn (KINDS), so `--prompts 13` asks one of each and 26 all.
Answers run to 128 tokens or the end of the turn: most are prose, the case where a
draft model is least often right and -k auto must still not lose.
"""

from __future__ import annotations

MAX_NEW_TOKENS = 128

WRITTEN = {
    "writing": [
        "Write a short, warm email to a colleague thanking them for covering my shifts last week while I was ill.",
        "Write the opening paragraph of a mystery story set in a lighthouse during a winter storm.",
    ],
    "roleplay": [
        "You are a tour guide in Rome in the year 1900. A visitor asks you what they must see in one afternoon. Stay "
        "in character and answer.",
        "Pretend to be a grumpy but kind ship's cook. A new sailor asks what is for dinner tonight. Reply in character.",
    ],
    "reasoning": [
        "Anna is taller than Ben. Ben is taller than Carla. Dan is shorter than Carla but taller than Eve. Who is the "
        "second shortest? Explain your reasoning step by step.",
        "A farmer must cross a river with a wolf, a goat and a cabbage, and his boat carries only one of them at a "
        "time. Describe how he gets all three across safely.",
    ],
    "math": [
        "Find all real solutions of x^2 - 5x + 6 = 0 and check each one.",
        "What is the sum of the interior angles of a hexagon? Show how you get the answer.",
    ],
    "coding": [
        "Explain the difference between a list and a tuple in Python, and when you would choose each.",
        "How would you find duplicate rows in a SQL table with columns id, email and created_at? Give the query.",
    ],
    "stem": [
        "Explain why the sky is blue, in terms a curious twelve-year-old would understand.",
        "What is the difference between mitosis and meiosis? Give the main steps of each.",
    ],
    "humanities": [
        "What were the main causes of the French Revolution? Give three and explain each briefly.",
        "Compare the philosophies of Plato and Aristotle on where knowledge comes from.",
    ],
    "translation": [
        "Translate into French: 'The train to Lyon leaves at seven, so we should have breakfast early and pack our "
        "bags tonight. Do not forget your passport and the tickets.'",
        "Translate into German: 'Our library opens at nine in the morning and closes at six in the evening. "
        "Children under twelve must be accompanied by an adult, and food is not allowed in the reading rooms.'",
    ],
    "qa": [
        "Which planet in our solar system has the most moons, and roughly how many does it have?",
        "Who wrote 'Pride and Prejudice', and when was it first published?",
    ],
    "math-word": [
        "A bakery sells muffins at $3 each or a box of 6 for $15. Tom needs 20 muffins. What is the cheapest way for "
        "him to buy them, and how much does he pay?",
        "A train leaves at 14:10 and travels 210 km at an average of 84 km/h. At what time does it arrive?",
    ],
}

SUMMARIZE = "Summarise the following documentation in three sentences.\n\n"
EXTRACT = ("List every function, class or method name that the following documentation mentions, one per line, and "
           "nothing else.\n\n")
# The order kinds are asked in: the first few (what `make demo` asks) are varied and
# short, bar one summary of a long document.
KINDS = ("writing", "translation", "roleplay", "summarization", "qa", "math-word", "extraction", "reasoning", "rag",
         "math", "coding", "stem", "humanities")
RAG = ("Answer the question using only the documents below, and say which document the answer comes from.\n\n"
       "{documents}\n\nQuestion: {question}")
# (the module a question is about, the question): its docstring says the answer plainly.
# Six documents in all (about 2,000 tokens): the asked-about one among the standard
# library's docstrings of 1,000-1,600 characters, in name order.
RAG_QUESTIONS = [
    ("argparse", "Which module is an optparse-inspired command-line parsing library, and what three things does "
                 "it do?"),
    ("shelve", "What may the values of a shelf be, and what must its keys be?"),
]
LONG_CONTEXT = [("summarization", "configparser"), ("summarization", "socketserver"),
                ("extraction", "statistics"), ("extraction", "cmd")]
RAG_DOCUMENTS, RAG_CHARS = 6, (1000, 1600)


def chat_cases(docstrings: dict[str, str]) -> list[tuple[str, str, str]]:
    """(kind, id, prompt text) of every chat prompt, kinds taken in turn."""
    by_kind: dict[str, list[tuple[str, str]]] = {}
    for kind, texts in WRITTEN.items():
        by_kind[kind] = [(f"{kind}-{i}", text) for i, text in enumerate(texts)]
    for kind, module in LONG_CONTEXT:
        instruction = SUMMARIZE if kind == "summarization" else EXTRACT
        by_kind.setdefault(kind, []).append((f"{kind}-{module}", instruction + docstrings[module]))
    middling = sorted(n for n, doc in docstrings.items() if RAG_CHARS[0] <= len(doc) <= RAG_CHARS[1])
    for i, (module, question) in enumerate(RAG_QUESTIONS):
        names = [n for n in middling if n != module][i * RAG_DOCUMENTS:][: RAG_DOCUMENTS - 1]
        names.insert((3 + 2 * i) % RAG_DOCUMENTS, module)  # not always first or last
        documents = "\n\n".join(f"Document {j + 1} ({name}):\n{docstrings[name]}" for j, name in enumerate(names))
        by_kind.setdefault("rag", []).append((f"rag-{module}", RAG.format(documents=documents, question=question)))
    rounds = max(len(cases) for cases in by_kind.values())
    return [(kind, *by_kind[kind][i]) for i in range(rounds) for kind in KINDS if i < len(by_kind[kind])]
