#!/usr/bin/env python3
"""Reference data for gemmarun's tokenizer tests (not run by CI; outputs are committed).

Run with the reference venv:  /opt/refvenv/bin/python tests/ref/make_tokenizer_ref.py

Writes
  tests/ref/tokenizer_ref.json      ~300 strings + ids from the Hugging Face tokenizer of the
                                    real Gemma 3 270M GGUF, plus chat-template renderings;
                                    read by tests/unit/test_tokenizer_model.c
  tests/ref/tiny_tokenizer.json     a tiny BPE tokenizer.json (byte fallback, Gemma's
                                    normalizer, a few special/added tokens) trained here with
                                    the `tokenizers` library
  tests/ref/tiny_tokenizer_ref.json ~50 strings + ids from that tokenizer (kept apart because
                                    `tokenizers` refuses unknown keys inside tokenizer.json);
                                    read by tests/unit/test_tokenizer.c

How the Gemma reference is built: transformers.AutoTokenizer.from_pretrained(dir,
gguf_file=...) (transformers 5.x rebuilds the merges from the GGUF vocabulary, ordered by token
position, and respells the space-run tokens "  ".. as "▁▁"..; it yields 514,906 merges, the
same count as Google's tokenizer.json, formats.md §2.3). Before writing anything the script
checks that this tokenizer reproduces every vector of formats.md §2.5.

It also runs a Python model of llama.cpp's SPM procedure (formats.md §2.2: highest score
first, user-defined tokens split out longest-first) on the same strings and prints every
string where it disagrees with Hugging Face; the list is stored under "llama_cpp_differs".
"""
import glob
import heapq
import json
import os
import random
import sys

import tokenizers
import transformers
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
GGUF_DIR = os.path.expanduser(os.environ.get("GEMMARUN_HOME", "~/.cache/gemmarun") + "/models")
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"

# ---- formats.md §2.5 ------------------------------------------------------------------------
VECTORS_BOS = [
    ("Hello world", [2, 9259, 1902]),
    (" Hello", [2, 26352]),
    ("Hello  world", [2, 9259, 138, 12392]),
    ("hello\n\nworld", [2, 23391, 108, 12392]),
    ("<start_of_turn>user\nHi<end_of_turn>\n", [2, 105, 2364, 107, 10979, 106, 107]),
    ("1234567", [2, 236770, 236778, 236800, 236812, 236810, 236825, 236832]),
    ("naïve café", [2, 1789, 238527, 560, 33443]),
    ("🙂", [2, 240731]),
    ("\t\tx", [2, 255969, 236781]),
    ("", [2]),
    (" ", [2, 236743]),
]
VECTORS_NOBOS = [
    ("𓀀", [478, 385, 366, 366]),
    ("a\u0007b", [236746, 245, 236763]),
    ("The quick brown fox jumps over the lazy dog.", [818, 3823, 8864, 37423, 38167, 1024, 506, 31770, 4799, 236761]),
    ("I'm", [236777, 236789, 236757]),
    ("<start_of_turn>model\n", [105, 4368, 107]),
]


def fortunes(rng, count, max_chars=500):
    """English prose from the fortune files, deterministic."""
    files = sorted(f for f in glob.glob("/usr/share/games/fortunes/*")
                   if not f.endswith((".dat", ".u8")) and os.path.isfile(f))
    pool = []
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            pool += [s.strip("\n") for s in fh.read().split("\n%\n") if s.strip()]
    rng.shuffle(pool)
    return [s[:max_chars] for s in pool[:count]]


CODE = [
    "int main(int argc, char **argv) {\n    printf(\"hello, world\\n\");\n    return 0;\n}\n",
    "def f(x):\n    return [i * i for i in range(x) if i % 2 == 0]\n",
    "for (size_t i = 0; i < n; i++) y[i] += a * x[i];",
    "{\"name\": \"gemma\", \"layers\": 18, \"rope_theta\": 1e6, \"tied\": true}",
    "#!/bin/sh\nset -eu\ncmake -S . -B build && cmake --build build -j2\n",
    "<html><body><div class=\"x\">text</div></body></html>",
    "<table><tr><td>1</td><td>2</td></tr></table>",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "x = lambda a, b: (a ** 2 + b ** 2) ** 0.5  # hypot",
    "fn main() { let v: Vec<u32> = (0..10).collect(); println!(\"{:?}\", v); }",
    "if (x != NULL && x->next == NULL) { free(x); x = NULL; }",
    "\t\tif x:\n\t\t\treturn y\n",
    "    indented with four spaces\n        and eight\n",
    "a_b_c __init__ self.__dict__ CamelCaseName snake_case_name",
    "https://example.com/path/to/file.html?query=1&b=2#frag",
    "user@example.org, +1 (555) 123-4567",
    "// comment\n/* block\n   comment */\n",
    "====================\n--------------------\n....................",
    "~~~ ``` *** ___ +++ ### $$$ %%% &&& |||",
    "((((((()))))))[[[[]]]]{{{{}}}}<<<<>>>>",
]

NUMBERS = ["0", "7", "42", "3.14159", "-273.15", "1e-9", "6.022e23", "1,000,000", "2024-01-31",
           "12:34:56", "0xDEADBEEF", "1234567890123456789", "99.9%", "$1,234.56", "1/3 + 2/3 = 1"]

UNICODE = [
    "😀😃😄😁", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷🇯🇵", "🙂🙃", "❤️", "✨🚀🌍",
    "中文字符测试", "日本語のテキスト", "한국어 텍스트", "繁體中文與简体中文",
    "Привет, мир!", "Γειά σου Κόσμε", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก",
    "e\u0301 a\u0300 o\u0308 n\u0303", "Z\u0351\u0352\u0353a\u0354\u0355l\u0356g\u0357o", "ﬁ ﬂ ﬀ ½ ² ™ ©",
    "∀x∈ℝ: x² ≥ 0", "αβγδε ∑∏∫√∞", "𓀀𓀁𓀂", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "\u200b\u200c\u200d\ufeff",
    "a\u0007b\u0001c\u001f", "tab\there", "crlf\r\nline", "\u00a0non-breaking\u00a0space",
    "naïve café résumé", "Ærøskøbing Straße", "İstanbul ıi", "Ǆ ǅ ǆ",
]

WHITESPACE = [" ", "  ", "   ", " " * 8, " " * 31, " " * 32, " " * 33, " " * 40, " " * 64,
              "a" + " " * 40 + "b", "x" + " " * 31 + "y", "\t", "\t" * 3, "\t" * 31, "\t" * 35,
              "\n", "\n" * 2, "\n" * 5, "\n" * 31, "\n" * 40, " \n \n ", "\n \t \n", "  leading",
              "trailing  ", "  both  ", " a b c ", "word\n\n\nword", "\r\n\r\n", " \u3000 "]

SPECIAL = [
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n",
    "<bos>", "<eos>", "<pad><unk><mask>", "<unused0><unused10><unused6241>", "[multimodal]",
    "<start_of_image><end_of_image>", "<start_of_tur", "<<start_of_turn>>", "<end_of_turn><end_of_turn>",
    "text<start_of_turn>text", "<table>x</table>", "<0x41>", "<b>bold</b> <i>it</i>",
]

TIES = ["=====", "======", "==========", "-----", "..........", "!!!!!!", "aaaaaaa", "*****",
        "________", "////////", "0000000000", "ababababab", "the the the the"]


def gemma_strings(rng):
    strs = fortunes(rng, 150) + CODE + NUMBERS + UNICODE + WHITESPACE + SPECIAL + TIES + ["", "a", "A"]
    cases = [{"text": s, "add_special": True, "parse_special": True} for s in strs]
    # some without BOS, and some with special tokens treated as text (HF split_special_tokens)
    for s in SPECIAL + ["Hello world", "The quick brown fox", "🙂", "", "  x", "\n\n"]:
        cases.append({"text": s, "add_special": False, "parse_special": True})
    for s in SPECIAL + ["<start_of_turn>model\n", "<bos>hi<eos>"]:
        cases.append({"text": s, "add_special": False, "parse_special": False})
    return cases


def hf_encode(tok, case):
    return tok(case["text"], add_special_tokens=case["add_special"],
               split_special_tokens=not case["parse_special"])["input_ids"]


# ---- llama.cpp SPM procedure (formats.md §2.2), for the report only -----------------------
class LlamaSpm:
    def __init__(self, gguf_path):
        from gguf import GGUFReader
        r = GGUFReader(gguf_path)
        f = r.fields
        self.tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode() for i in f["tokenizer.ggml.tokens"].data]
        self.scores = [float(f["tokenizer.ggml.scores"].parts[i][0]) for i in f["tokenizer.ggml.scores"].data]
        self.types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
        self.vocab = {t: i for i, t in enumerate(self.tokens)}
        ct = f.get("tokenizer.chat_template")
        self.chat_template = bytes(ct.parts[ct.data[0]]).decode() if ct is not None else None
        self.special = sorted((i for i, ty in enumerate(self.types) if ty in (2, 3, 4)),
                              key=lambda i: -len(self.tokens[i].encode()))

    def encode(self, text, add_bos, parse_special):
        frags = [("t", text)]
        for i in self.special:
            if not parse_special and self.types[i] != 4:
                continue
            t, nf = self.tokens[i], []
            for k, v in frags:
                if k != "t" or t not in v:
                    nf.append((k, v))
                    continue
                parts = v.split(t)
                for pi, p in enumerate(parts):
                    if p:
                        nf.append(("t", p))
                    if pi < len(parts) - 1:
                        nf.append(("s", i))
            frags = nf
        out = [2] if add_bos else []
        for k, v in frags:
            if k == "s":
                out.append(v)
                continue
            syms = list(v.replace(" ", "\u2581"))
            n = len(syms)
            nxt = list(range(1, n + 1))
            if n:
                nxt[-1] = -1
            prev = list(range(-1, n - 1))
            alive = [True] * n
            heap, rev = [], {}

            def push(i):
                if i < 0 or nxt[i] < 0:
                    return
                m = syms[i] + syms[nxt[i]]
                if m in self.vocab:
                    heapq.heappush(heap, (-self.scores[self.vocab[m]], i, syms[i], syms[nxt[i]]))

            for i in range(n - 1):
                push(i)
            while heap:
                _, i, left, right = heapq.heappop(heap)
                j = nxt[i]
                if not alive[i] or j < 0 or syms[i] != left or syms[j] != right:
                    continue
                rev[left + right] = (left, right)
                syms[i] = left + right
                alive[j] = False
                nxt[i] = nxt[j]
                if nxt[j] >= 0:
                    prev[nxt[j]] = i
                push(prev[i])
                push(i)

            def emit(t):
                if t in self.vocab:
                    out.append(self.vocab[t])
                elif t in rev:
                    emit(rev[t][0])
                    emit(rev[t][1])
                else:
                    out.extend(self.vocab["<0x%02X>" % b] for b in t.encode())

            for i in range(n):
                if alive[i]:
                    emit(syms[i])
        return out


# Gemma 3's chat template: the "chat_template" string of google/gemma-3-*-it tokenizer_config.json
# (gemma_architecture.md §2.5), JSON-escaped exactly as it appears there. The 270M GGUF is the
# pretrained model and carries no tokenizer.chat_template, so the template is supplied here.
GEMMA3_CHAT_TEMPLATE = json.loads(r'''"{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- if messages[0]['content'] is string -%}\n        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n    {%- else -%}\n        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n    {%- endif -%}\n    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n    {%- endif -%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n    {%- elif message['content'] is iterable -%}\n        {%- for item in message['content'] -%}\n            {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}\n            {%- elif item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n            {%- endif -%}\n        {%- endfor -%}\n    {%- else -%}\n        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n    {{ '<end_of_turn>\n' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\n'}}\n{%- endif -%}\n"''')


CHATS = [
    ([{"role": "user", "content": "Hi"}], True),
    ([{"role": "user", "content": "  What is 2+2?  \n"}, {"role": "assistant", "content": " 4. \n"}], False),
    ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."}], True),
    ([{"role": "system", "content": "  Keep spaces  "}, {"role": "user", "content": "x"},
      {"role": "model", "content": "y"}, {"role": "user", "content": "z"}], True),
    ([{"role": "user", "content": "Translate: naïve café 🙂"}, {"role": "assistant", "content": "Naïf café 🙂"}], False),
    ([{"role": "user", "content": "Line 1\n\nLine 2\tTabbed"}, {"role": "assistant", "content": "OK\n"},
      {"role": "user", "content": "Again?"}, {"role": "assistant", "content": "Yes."}], False),
]


def make_gemma_ref():
    path = os.path.join(GGUF_DIR, GGUF_NAME)
    if not os.path.exists(path):
        sys.exit(f"missing {path}: run `gemmarun fetch gemma3-270m` first")
    tok = transformers.AutoTokenizer.from_pretrained(GGUF_DIR, gguf_file=GGUF_NAME)
    bad = 0
    for text, ids in VECTORS_BOS:
        got = tok(text, add_special_tokens=True)["input_ids"]
        if got != ids:
            print("VECTOR MISMATCH", repr(text), got, ids)
            bad += 1
    for text, ids in VECTORS_NOBOS:
        got = tok(text, add_special_tokens=False)["input_ids"]
        if got != ids:
            print("VECTOR MISMATCH", repr(text), got, ids)
            bad += 1
    if bad:
        sys.exit(f"{bad} formats.md §2.5 vectors not reproduced; refusing to write references")
    print(f"all {len(VECTORS_BOS) + len(VECTORS_NOBOS)} formats.md §2.5 vectors reproduced")

    rng = random.Random(20240601)
    cases = gemma_strings(rng)
    spm = LlamaSpm(path)
    differs = []
    for i, c in enumerate(cases):
        c["ids"] = hf_encode(tok, c)
        ll = spm.encode(c["text"], c["add_special"], c["parse_special"])
        if ll != c["ids"]:
            differs.append(i)
            print(f"llama.cpp-style differs on case {i} {c['text'][:60]!r}:\n   hf    {c['ids'][:24]}\n   llama {ll[:24]}")
        dec = tok.decode(c["ids"], skip_special_tokens=False)
        c["decoded"] = dec[len("<bos>"):] if c["add_special"] and dec.startswith("<bos>") else dec
    print(f"{len(cases)} strings; llama.cpp-style procedure differs from Hugging Face on {len(differs)}")

    # an instruction-tuned GGUF carries its own template; the 270M base model does not
    tok.chat_template = spm.chat_template or GEMMA3_CHAT_TEMPLATE
    chats = []
    for msgs, gen in CHATS:
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
        assert text.startswith("<bos>"), text[:20]
        ids = tok(text[len("<bos>"):], add_special_tokens=True)["input_ids"]
        ids_direct = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=gen)
        if isinstance(ids_direct, dict) or hasattr(ids_direct, "keys"):
            ids_direct = ids_direct["input_ids"]
        assert ids == list(ids_direct), (ids, ids_direct)
        chats.append({"messages": msgs, "add_generation_prompt": gen, "text": text[len("<bos>"):], "ids": ids})

    out = {
        "source": f"transformers {transformers.__version__} / tokenizers {tokenizers.__version__}: "
                  f"AutoTokenizer.from_pretrained(gguf_file={GGUF_NAME!r})",
        "llama_cpp_differs": differs,
        "cases": cases,
        "chats": chats,
    }
    dst = os.path.join(HERE, "tokenizer_ref.json")
    with open(dst, "w", encoding="utf-8") as fh:
        fh.write("{\n")
        for k in ("source", "llama_cpp_differs"):
            fh.write(f" {json.dumps(k)}: {json.dumps(out[k], ensure_ascii=False)},\n")
        for k in ("cases", "chats"):
            fh.write(f" {json.dumps(k)}: [\n")
            fh.write(",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in out[k]))
            fh.write("\n ]" + (",\n" if k == "cases" else "\n"))
        fh.write("}\n")
    print(f"wrote {dst} ({os.path.getsize(dst)} bytes)")


# ---- tiny tokenizer ---------------------------------------------------------------------------
TINY_SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]


def make_tiny():
    rng = random.Random(7)
    corpus = fortunes(rng, 400)
    # 1. learn merges on the normalized text (what the Gemma pipeline feeds the model)
    trainer_tok = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_tok.normalizer = normalizers.Replace(" ", "\u2581")
    trainer = trainers.BpeTrainer(vocab_size=170, special_tokens=TINY_SPECIAL, limit_alphabet=64,
                                  show_progress=False)
    trainer_tok.train_from_iterator(corpus, trainer)
    learned = json.loads(trainer_tok.to_str())["model"]
    # 2. lay out the vocabulary as Gemma does: specials, the 256 byte tokens, then the rest
    vocab = {t: i for i, t in enumerate(TINY_SPECIAL)}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for t, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1]):
        if t not in vocab:
            vocab[t] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in learned["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in TINY_SPECIAL])
    tok.add_tokens([AddedToken("\n\n", normalized=False), AddedToken("<html>", normalized=False),
                    AddedToken("hello world", normalized=True),
                    AddedToken("<mark>", normalized=False, lstrip=True, rstrip=True)])
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])])
    dst = os.path.join(HERE, "tiny_tokenizer.json")
    tok.save(dst, pretty=True)
    tok = Tokenizer.from_file(dst)  # encode with exactly what was written
    print(f"tiny tokenizer: {tok.get_vocab_size()} ids, {len(merges)} merges -> {dst}")

    texts = corpus[400 - 20:] + [
        "", " ", "  ", "hello world", "say hello world twice: hello world", "Hello World",
        "a<mark>b", "a  <mark>  b", "<start_of_turn>user\nHi<end_of_turn>\n", "<bos>x<eos>",
        "x\n\ny\n\n\nz", "<html>page</html>", "naïve café", "🙂 emoji", "中文", "𓀀", "tab\tand\ttabs",
        "a\u0007b", "the then there these", "  leading and trailing  ", "0123456789", "=====",
        "It's a dog's life.", "<start_of_tur", "<unk><pad>", "ababab", "e\u0301", "ÿþ", "\u00a0",
        "MiXeD CaSe WoRdS",
    ]
    cases = []
    for t in texts:
        for add_special, parse_special in ((True, True), (False, True), (False, False)):
            if (add_special, parse_special) != (True, True) and not any(
                    s in t for s in TINY_SPECIAL + ["<mark>", "<html>", "\n\n", "hello world"]) and t != texts[0]:
                continue
            tok.encode_special_tokens = not parse_special
            ids = tok.encode(t, add_special_tokens=add_special).ids
            tok.encode_special_tokens = False
            cases.append({"text": t, "add_special": add_special, "parse_special": parse_special, "ids": ids,
                          "decoded": tok.decode(ids, skip_special_tokens=False)})
    dst = os.path.join(HERE, "tiny_tokenizer_ref.json")
    with open(dst, "w", encoding="utf-8") as fh:
        fh.write('{\n "source": ' + json.dumps(f"tokenizers {tokenizers.__version__}, tiny_tokenizer.json") + ',\n')
        fh.write(' "cases": [\n' + ",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in cases) + "\n ]\n}\n")
    print(f"{len(cases)} tiny reference encodings -> {dst}")


if __name__ == "__main__":
    make_tiny()
    make_gemma_ref()
