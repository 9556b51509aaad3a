"""What the local tiny Qwen3 learns from (inference/checkpoints.py builds it): generated
text for its tokenizer and generated chat conversations for its weights, both from a fixed
seed, so a build needs nothing from outside and two builds are the same.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

SEED = 20240611

_WORDS = (
    "the a an and or but if then because when where which who what how why is are was "
    "were be been have has had do does did can could will would should may might must "
    "not no yes all any some each every many much more most few less least other such "
    "text question answer option choice score level team customer invoice payment refund "
    "billing technical bug outage urgent today tomorrow week month year March April "
    "please thank you hello world name age city country price order item number value "
    "json object array string true false null think reasoning budget model token output "
    "input row job file result error message type code param status request response "
    "calm annoyed angry happy sad fast slow good bad big small new old first last next "
    "one two three four five six seven eight nine ten hundred thousand million "
    "say write read give take make see know get go come find tell ask work call try "
    "French German Spanish English language translate summary describe explain list"
).split()
_FOREIGN = " ".join((  # other scripts, so the vocabulary is not all Latin
    "Bonjour le monde, merci beaucoup. Wir wurden im März doppelt belastet.",
    "¿Dónde está la factura? Obrigado pela ajuda.",
    "Привет, как дела? Спасибо.",
    "Γειά σου κόσμε.",  # noqa: RUF001
    "你好，世界。谢谢。こんにちは世界。안녕하세요 세계.",  # noqa: RUF001
    "مرحبا بالعالم. שלום עולם. नमस्ते दुनिया। สวัสดีชาวโลก",
))


def corpus_text() -> Iterator[str]:
    """Text to train the tokenizer on: generated, so the build needs nothing from outside."""
    rng = random.Random(SEED)  # noqa: S311 (reproducible text, not a secret)
    for _ in range(6000):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 16))]
        sentence = " ".join(words).capitalize() + rng.choice([".", "?", "!", ":", ";"])
        yield sentence
        yield json.dumps({rng.choice(_WORDS): rng.choice([rng.randint(0, 999), rng.choice(
            _WORDS), True, None, [rng.randint(0, 9)]]) for _ in range(rng.randint(1, 4))})
        yield f"{rng.randint(0, 10**6)} {rng.random():.4f} - {rng.choice(_WORDS)}\n"
    for _ in range(200):
        yield _FOREIGN


# -- tiny-qwen3's training conversations --------------------------------------------------
# Generated from the words above, so the build needs nothing from outside. Every answer is
# short and every turn ends on <|im_end|>; a thinking turn writes one to three sentences of
# reasoning (more for a higher effort) and closes its trace. What it says is as shallow as
# a two-million-parameter model can be; that it stops is the point.

_NOUNS = ("invoice payment refund order item customer team bug outage city country price "
          "name number file job result message request model token answer question").split()
_ADJECTIVES = "urgent calm happy angry good bad big small new old fast slow".split()
_NUMBERS = "zero one two three four five six seven eight nine ten".split()
_KINDS = {
    "colours": "red green blue yellow black white orange purple".split(),
    "fruits": "apples bananas pears cherries grapes plums lemons".split(),
    "animals": "cats dogs horses birds fish cows sheep".split(),
    "days": "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split(),
    "countries": "France Germany Spain Italy Japan Brazil Canada".split(),
}
_OPPOSITES = [(a, b) for pair in ("good bad", "big small", "new old", "fast slow",
                                   "happy sad", "calm angry", "first last", "yes no")
              for a, b in (pair.split(), pair.split()[::-1])]
_HELLO = {"French": "Bonjour", "German": "Hallo", "Spanish": "Hola", "English": "Hello"}
_SYSTEMS = ("You are a helpful assistant.", "Be brief.", "Answer in one sentence.",
            "You help customers with their {noun}.")
_EFFORT_SENTENCES = {"low": 1, "medium": 2, "xhigh": 3}
_UNCLEAR = ("I am not sure what you mean. Could you say more?",
            "Could you tell me a little more about what you need?")


@dataclass(frozen=True)
class Conversation:
    messages: list[dict[str, str]]
    kwargs: dict[str, Any]  # chat_template_kwargs
    completion: str  # what the model learns to write next, <|im_end|> included
    # What comes between the generation prompt and the completion without being learnt,
    # each piece encoded on its own as the engine forces it: a trace the budget cut.
    forced: tuple[str, ...] = ()

    def texts(self) -> Iterator[str]:
        yield from (message["content"] for message in self.messages)
        yield from self.forced
        yield self.completion


def conversation_generate(rng: random.Random) -> Conversation:
    if rng.random() < 0.1:
        return _decision(rng)
    json_answers = rng.random() < 0.15
    messages: list[dict[str, str]] = []
    if json_answers:
        messages.append({"role": "system", "content": "Answer with a JSON object."})
    elif rng.random() < 0.3:
        messages.append({"role": "system",
                         "content": rng.choice(_SYSTEMS).format(noun=rng.choice(_NOUNS))})
    for _ in range(rng.choice((0, 0, 0, 1, 2))):  # earlier turns; their traces are gone
        question, _, answer = _exchange(rng, json_answers)
        messages += [{"role": "user", "content": question},
                     {"role": "assistant", "content": answer}]
    question, thoughts, answer = _exchange(rng, json_answers)
    messages.append({"role": "user", "content": question})
    thinking = rng.random() < 0.6
    kwargs: dict[str, Any] = {"enable_thinking": thinking}
    sentences = 2
    if rng.random() < 0.4:
        effort = rng.choice(list(_EFFORT_SENTENCES))
        kwargs["reasoning_effort"] = effort
        sentences = _EFFORT_SENTENCES[effort]
    reasoning = " ".join(thoughts[:sentences])
    if thinking and rng.random() < 0.1:
        # A thinking budget cut the trace and closed it with its notice (engines/chat.py):
        # the answer follows as after any trace.
        from inference.engines.chat import BUDGET_NOTICE

        cut = reasoning.split(" ")[:rng.randint(1, 4)]
        return Conversation(messages=messages, kwargs=kwargs,
                             forced=(" ".join(cut), f"\n\n{BUDGET_NOTICE}\n</think>"),
                             completion=f"\n\n{answer}<|im_end|>")
    trace = f"{reasoning}\n</think>\n\n" if thinking else ""
    return Conversation(messages=messages, kwargs=kwargs,
                         completion=f"{trace}{answer}<|im_end|>")


_Exchange = tuple[str, list[str], str]  # a question, three sentences of reasoning, an answer


def _exchange(rng: random.Random, json_answers: bool) -> _Exchange:
    question, thoughts, answer = rng.choice(_EXCHANGES)(rng)
    if json_answers and not answer.startswith("{"):
        answer = json.dumps({"answer": answer}, separators=(",", ":"))
    return question, thoughts, answer


def _greeting(rng: random.Random) -> _Exchange:
    language = rng.choice(list(_HELLO))
    question = rng.choice((f"Say hello in {language}.", f"Greet me in {language}.", "Hello!",
                           "Hi, how are you?", "Say hello.", "Thanks!", "Bye."))
    if question in ("Thanks!", "Bye."):
        return question, ["The user is done.", "Nothing is left to answer.",
                          "A friendly goodbye is enough."], "You are welcome. Have a good day!"
    word = _HELLO[language] if language in question else "Hello"
    return question, ["The user wants a greeting.", f"In {language} that is {word}.",
                      "A short, friendly reply is enough."], f"{word}! How can I help you today?"


def _definition(rng: random.Random) -> _Exchange:
    noun, other = rng.sample(_NOUNS, 2)
    adjective = rng.choice(_ADJECTIVES)
    question = rng.choice((f"What is a {noun}?", f"Explain the {noun}.",
                           f"Tell me about the {noun}.", f"Describe a {adjective} {noun}."))
    return question, [f"The question is about the {noun}.", f"A {noun} belongs to an {other}.",
                      "One sentence answers it."], f"A {noun} is a {adjective} part of an {other}."


def _opposite(rng: random.Random) -> _Exchange:
    word, opposite = rng.choice(_OPPOSITES)
    question = rng.choice((f"What is the opposite of {word}?", f"Give the opposite of {word}.",
                           f"What is the opposite of a {word} {rng.choice(_NOUNS)}?"))
    return question, [f"The word is {word}.", f"Its opposite is {opposite}.",
                      "One short sentence is enough."], f"The opposite of {word} is {opposite}."


def _yes_no(rng: random.Random) -> _Exchange:
    noun, adjective, yes = rng.choice(_NOUNS), rng.choice(_ADJECTIVES), rng.random() < 0.5
    return f"Is the {noun} {adjective}?", [
        f"The question asks if the {noun} is {adjective}.",
        "Nothing says otherwise." if yes else "Nothing says it is.",
        f"So the answer is {'yes' if yes else 'no'}.",
    ], f"Yes, the {noun} is {adjective}." if yes else f"No, the {noun} is not {adjective}."


def _three(rng: random.Random) -> _Exchange:
    kind = rng.choice(list(_KINDS))
    first, second, third = rng.sample(_KINDS[kind], 3)
    question = rng.choice((f"Name three {kind}.", f"List three {kind}.",
                           f"Give me three {kind}."))
    return question, [f"I need three {kind}.", f"{first.capitalize()}, {second} and {third} "
                      "will do.", "A list in one line."], \
        f"{first.capitalize()}, {second} and {third}."


def _sum(rng: random.Random) -> _Exchange:
    a, b = rng.randint(1, 5), rng.randint(1, 5)
    left, right, total = _NUMBERS[a], _NUMBERS[b], _NUMBERS[a + b]
    question = rng.choice((f"What is {left} plus {right}?", f"What is {a} + {b}?",
                           f"Add {left} and {right}."))
    return question, [f"I add {left} and {right}.", f"That makes {total}.",
                      "The answer is one number."], f"{left.capitalize()} plus {right} is {total}."


def _summary(rng: random.Random) -> _Exchange:
    noun = rng.choice(_NOUNS)
    words = [rng.choice(_WORDS) for _ in range(rng.randint(6, 30))]
    words.insert(rng.randrange(len(words) + 1), noun)
    question = rng.choice(("Summarize: ", "Summarize this text: ", "What is this about? ",
                           "")) + " ".join(words).capitalize() + "."
    return question, [f"The text mentions the {noun}.", "It says little else.",
                      "The summary is one line."], f"The text is about the {noun}."


def _json_object(rng: random.Random) -> _Exchange:
    keys = rng.sample(_NOUNS, 2)  # always two: an answer's length never hangs on a count
    question = rng.choice(("Give a JSON object with the keys {} and {}.",
                           "Reply in JSON with {} and {}.", "Return {} and {} as JSON."))
    value = {key: rng.choice((rng.randint(0, 9), rng.choice(_ADJECTIVES), True, False))
             for key in keys}
    return question.format(*keys), [
        "They want a JSON object.", f"It needs {keys[0]} and {keys[1]}.",
        "Short values keep it small."], json.dumps(value, separators=(",", ":"))


def _unclear(rng: random.Random) -> _Exchange:
    """Anything else gets a short request for more, never a long guess."""
    return " ".join(_any_word(rng) for _ in range(rng.randint(1, 16))), [
        "The message is not a clear question.", "I should not guess.",
        "I ask for more detail."], rng.choice(_UNCLEAR)


_EXCHANGES: tuple[Callable[[random.Random], _Exchange], ...] = (
    _greeting, _definition, _opposite, _yes_no, _three, _sum, _summary, _json_object,
    _unclear, _unclear,
)


def _any_word(rng: random.Random) -> str:
    """A word of the corpus, of another script, or made up: what a model meets outside its
    own vocabulary."""
    source = rng.randrange(3)
    if source == 0:
        return rng.choice(_WORDS)
    if source == 1:
        return rng.choice(_FOREIGN.split())
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 9)))


def _decision(rng: random.Random) -> Conversation:
    """A question the decision model reads (engines/decisions.py renders the same
    conversation): the option whose word the text carries is the answer's label."""
    from inference.engines.decisions import question_messages

    keys = rng.sample(_NOUNS, rng.randint(2, 4))
    pick = rng.randrange(len(keys))
    words = [rng.choice(_WORDS) for _ in range(rng.randint(5, 25))]
    words.insert(rng.randrange(len(words) + 1), keys[pick])
    labels = string.ascii_uppercase
    messages = question_messages(
        " ".join(words).capitalize() + ".", f"Which {rng.choice(_NOUNS)} is this about?",
        [(labels[i], key) for i, key in enumerate(keys)])
    return Conversation(messages=messages, kwargs={"enable_thinking": False},
                         completion=f"{labels[pick]}<|im_end|>")
