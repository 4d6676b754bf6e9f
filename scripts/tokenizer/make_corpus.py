#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/corpus.jsonl: the strings the tokenizer parity tests encode.

Each line is {"name", "category", "text"} or, for bytes that are not valid UTF-8,
{"name", "category", "b64", "invalid_utf8": true}. "special": true marks strings that hold
literal special-token text (the reference is taken with special parsing on and off for every
string anyway). Deterministic: the random parts use a fixed seed.

Then run scripts/tokenizer/reference_ids.py to get llama.cpp's ids for a model.
"""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "tokenizer" / "corpus.jsonl"

PROSE = [
    "Hello world",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness.",
    "Call me Ishmael. Some years ago—never mind how long precisely—having little or no money in my purse, "
    "and nothing particular to interest me on shore, I thought I would sail about a little and see the watery part of the world.",
    "I can't believe it's not butter! They're here, we've won, you'll see, she'd know.",
    "\"Quoted text,\" she said, 'and single quotes too.'",
    "Don’t use curly quotes — or should you? “Maybe” ‘so’.",
    "Mr. Smith went to Washington D.C. on Jan. 5th at 3 p.m.",
    "e.g. i.e. etc. vs. a.k.a. U.S.A.",
    "What is the capital of France?",
    "The capital of France is Paris.",
    "Transformers use self-attention to mix information across positions in a sequence.",
    "Gemma is a family of lightweight, state-of-the-art open models built from the same research and technology used to create the Gemini models.",
    "Once upon a time, in a land far, far away, there lived a princess who loved mathematics.",
    "ALL CAPS SENTENCE WITH SHOUTING!!!",
    "lowercase sentence without punctuation",
    "MiXeD cAsE tExT iS aNnOyInG",
    "Hyphenated-words and under_scored_words and camelCaseWords and PascalCaseWords.",
    "Semicolons; colons: dashes – em-dashes — ellipses… and more...",
    "Parentheses (like these), brackets [like these], and braces {like these}.",
    "Email me at someone@example.com or visit https://example.com/path?query=1&x=y#frag.",
    "Tabs\tseparate\tcolumns\tin\tthis\tline.",
    "Line one.\nLine two.\nLine three.",
    "Paragraph one.\n\nParagraph two.\n\n\nParagraph three.",
    "Windows line endings\r\nare different\r\nfrom Unix ones.",
    "Old Mac line endings\rused carriage returns\ronly.",
    "A sentence that ends with a space ",
    " A sentence that starts with a space",
    "  Two leading spaces and two trailing  ",
    "Question? Answer! Exclamation. Comma, period.",
    "The year 1984 was not like 1984.",
    "She sells sea shells by the sea shore.",
    "Peter Piper picked a peck of pickled peppers.",
    "To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer.",
    "The mitochondria is the powerhouse of the cell.",
    "In 1492, Columbus sailed the ocean blue.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "A B C D E F G H I J K L M N O P Q R S T U V W X Y Z",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z",
    "Supercalifragilisticexpialidocious is a very long word.",
    "Rindfleischetikettierungsüberwachungsaufgabenübertragungsgesetz",
    "naïve café résumé coöperate façade jalapeño Zürich São Paulo",
]

CODE = {
    "python": 'def fib(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\nif __name__ == "__main__":\n    print(fib(10))\n',
    "python_class": "class Stack:\n    def __init__(self):\n        self._items = []\n\n    def push(self, x):\n        self._items.append(x)\n\n    def pop(self):\n        return self._items.pop()\n",
    "rust": 'fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!("{:?}", v);\n}\n',
    "rust_impl": "impl<T: Clone> Matrix<T> {\n    pub fn transpose(&self) -> Self {\n        let mut out = Vec::with_capacity(self.rows * self.cols);\n        for c in 0..self.cols {\n            for r in 0..self.rows {\n                out.push(self.data[r * self.cols + c].clone());\n            }\n        }\n        Matrix { rows: self.cols, cols: self.rows, data: out }\n    }\n}\n",
    "c": '#include <stdio.h>\n\nint main(int argc, char **argv) {\n\tfor (int i = 0; i < argc; ++i) {\n\t\tprintf("%d: %s\\n", i, argv[i]);\n\t}\n\treturn 0;\n}\n',
    "cpp": "template <typename T>\nstd::vector<T> filter(const std::vector<T>& xs, std::function<bool(const T&)> pred) {\n    std::vector<T> out;\n    std::copy_if(xs.begin(), xs.end(), std::back_inserter(out), pred);\n    return out;\n}\n",
    "javascript": "const add = (a, b) => a + b;\nasync function fetchJson(url) {\n  const res = await fetch(url);\n  if (!res.ok) throw new Error(`HTTP ${res.status}`);\n  return res.json();\n}\n",
    "typescript": "interface User {\n  id: number;\n  name: string;\n  email?: string;\n}\n\nexport function greet(u: User): string {\n  return `Hello, ${u.name}!`;\n}\n",
    "go": 'package main\n\nimport "fmt"\n\nfunc main() {\n\tch := make(chan int)\n\tgo func() { ch <- 42 }()\n\tfmt.Println(<-ch)\n}\n',
    "java": 'public class Hello {\n    public static void main(String[] args) {\n        System.out.println("Hello, World");\n    }\n}\n',
    "sql": "SELECT u.id, u.name, COUNT(o.id) AS orders\nFROM users u\nLEFT JOIN orders o ON o.user_id = u.id\nWHERE u.created_at >= '2024-01-01'\nGROUP BY u.id, u.name\nORDER BY orders DESC\nLIMIT 10;\n",
    "html": '<!DOCTYPE html>\n<html>\n<head><title>Test</title></head>\n<body>\n  <div class="container">\n    <p>Hello <b>bold</b> and <i>italic</i>.</p>\n    <table><tr><td>1</td><td>2</td></tr></table>\n  </div>\n</body>\n</html>\n',
    "css": ".container {\n  display: flex;\n  justify-content: space-between;\n  margin: 0 auto;\n  color: #ff00aa;\n}\n",
    "shell": '#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do\n  echo "Processing $f"\n  wc -l "$f" | awk \'{print $1}\'\ndone\n',
    "json": '{\n  "name": "rlx",\n  "version": "0.1.0",\n  "dependencies": {\n    "serde": "1.0",\n    "tokio": {"version": "1", "features": ["full"]}\n  },\n  "list": [1, 2, 3, null, true, false]\n}\n',
    "yaml": "services:\n  web:\n    image: nginx:latest\n    ports:\n      - \"80:80\"\n    environment:\n      - KEY=value\n",
    "haskell": "quicksort :: Ord a => [a] -> [a]\nquicksort [] = []\nquicksort (p:xs) = quicksort [x | x <- xs, x < p] ++ [p] ++ quicksort [x | x <- xs, x >= p]\n",
    "latex": "\\begin{equation}\n  E = mc^2 \\quad \\text{and} \\quad \\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}\n\\end{equation}\n",
    "markdown": "# Title\n\n## Subtitle\n\n- item one\n- item two\n  - nested item\n\n```python\nprint('hi')\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n",
    "deep_indent": "\n".join(" " * (4 * i) + f"level_{i}()" for i in range(12)) + "\n",
    "tab_indent": "\n".join("\t" * i + f"level_{i}" for i in range(10)) + "\n",
    "lisp": "(defun factorial (n)\n  (if (<= n 1)\n      1\n      (* n (factorial (- n 1)))))\n",
    "regex": r"^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[a-z0-9!#$%&'*+/=?^_`{|}~-]+)*)@(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+$",
    "assembly": "_start:\n    mov rax, 60\n    xor rdi, rdi\n    syscall\n",
    "diff": "--- a/file.txt\n+++ b/file.txt\n@@ -1,3 +1,3 @@\n-old line\n+new line\n context\n",
}

NUMBERS = [
    "0", "1", "42", "123", "1234", "12345", "123456789", "1234567890123456789012345678901234567890",
    "3.14159", "2.718281828459045", "-17", "+5", "1e10", "6.022e23", "1.6e-19", "0x1F", "0xDEADBEEF", "0b101010",
    "1,000,000", "1.000.000,50", "$1,234.56", "€99.99", "£5", "¥1000", "50%", "3/4", "½ ¼ ¾",
    "2024-03-15", "2024-03-15T12:34:56Z", "15/03/2024", "March 15, 2024", "12:30 PM", "23:59:59.999",
    "+1 (555) 123-4567", "192.168.0.1", "::1", "v1.2.3-beta.4+build.5", "ISBN 978-3-16-148410-0",
    "1st 2nd 3rd 4th 21st 22nd 101st", "Ⅰ Ⅱ Ⅲ Ⅳ Ⅻ", "١٢٣٤٥٦٧٨٩٠", "१२३४५", "一二三四五六七八九十", "𝟙𝟚𝟛",
    "3.0 3.00 3.000 0.1 .5 5.", "999999999999", "1+1=2", "2*3=6 and 10/2=5", "x^2 + y^2 = z^2",
]

EMOJI = [
    "😀", "😀😃😄😁", "👍", "👍🏽", "👍🏿👍🏻", "👨‍👩‍👧‍👦", "👩‍💻", "🧑🏾‍🚀", "🏳️‍🌈", "🏴‍☠️", "❤️", "❤️‍🔥",
    "🇯🇵🇺🇸🇩🇪", "1️⃣2️⃣3️⃣", "#️⃣", "🫠🫶🪿", "I love 🍕 and 🍣!", "Party 🎉🎊🥳 time", "👁️‍🗨️", "🤷‍♂️🤷‍♀️",
    "⌚⌛⏰", "☀️☁️☂️", "✅❌⚠️", "🏁🏎️💨", "🧬🔬🧪", "𓀀𓀁𓀂", "🀄🃏", "👨🏻‍❤️‍💋‍👨🏼",
]

SCRIPTS = [
    "你好，世界！今天天气很好。",
    "机器学习是人工智能的一个分支。",
    "これは日本語の文章です。ひらがな、カタカナ、漢字を含みます。",
    "東京タワーは333メートルです。",
    "안녕하세요, 세계! 한국어 문장입니다.",
    "مرحبا بالعالم! هذه جملة باللغة العربية.",
    "السلام عليكم ورحمة الله وبركاته",
    "שלום עולם! זה משפט בעברית.",
    "नमस्ते दुनिया! यह एक हिंदी वाक्य है।",
    "भारत एक विशाल देश है जिसमें अनेक भाषाएँ बोली जाती हैं।",
    "Привет, мир! Это предложение на русском языке.",
    "Γειά σου Κόσμε! Αυτή είναι μια ελληνική πρόταση.",
    "สวัสดีชาวโลก นี่คือประโยคภาษาไทย",
    "Xin chào thế giới! Đây là một câu tiếng Việt.",
    "வணக்கம் உலகம்! இது தமிழ் வாக்கியம்.",
    "ওহে বিশ্ব! এটি একটি বাংলা বাক্য।",
    "Բարեւ աշխարհ", "გამარჯობა მსოფლიო", "ሰላም ልዑል", "ᓄᓇᕗᑦ", "ꦱꦸꦒꦼꦁ",
    "Ελληνικά και English mixed with 中文 and العربية.",
    "Türkçe: çğıöşü ÇĞİÖŞÜ", "Polski: zażółć gęślą jaźń", "Íslenska: þetta er ð",
    "Español: ¿Dónde está la biblioteca? ¡Aquí!",
    "Français : « Bonjour » — l’été dernier.",
    "Deutsch: Größe, Straße, Äpfel, Öl, Übermut.",
]

COMBINING = [
    "e\u0301", "café", "cafe\u0301", "n\u0303", "a\u0300\u0301\u0302\u0303\u0304",
    "Z\u0324\u0354\u0367\u0311\u0313a\u0308\u0356\u032d\u0308\u0307l\u036e\u0312\u036bg\u030c\u0317\u035ao\u0319\u0314\u036e\u0307\u0350\u0307",
    "\u0915\u094d\u0937", "\u0e01\u0e34\u0e4a", "\u05e9\u05c1\u05b8", "\u1100\u1161\u11a8",
    "ﬁ ﬂ ﬀ ﬃ", "ＡＢＣ ａｂｃ １２３", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕿𝖊𝖝𝖙", "Å Å Å", "Ω Ω", "ǅ ǆ Ǆ",
    "\u200d", "a\u200db", "a\u200cb", "a\u200bb", "\ufeffBOM at start", "a\u00adb soft hyphen",
    "\u202eright-to-left override\u202c", "\u0301 leading combining mark",
    "control chars \u0001\u0002\u0007\u001b[31m red \u001b[0m", "null \u0000 byte",
    "\U0010ffff \U000e0001 \ufffd \uffff",
]

WHITESPACE = (
    [" " * n for n in range(1, 41)]
    + ["\t" * n for n in (1, 2, 3, 4, 8)]
    + ["\n" * n for n in (1, 2, 3, 4, 5, 10, 31, 32, 33, 40)]
    + ["\r\n", "\r\n\r\n", "\r", "\n\r", " \n", "\n ", " \n \n ", "\t\n\t", " \t \t ", "\n\n  \n\n",
       "a b", "a  b", "a   b", "a    b", "a\tb", "a\nb", "a\r\nb", "a \n b", "  a", "a  ", "   a   ",
       " hello", "hello ", "  hello  world  ", "\thello", "hello\t", "\nhello\n", "\n\nhello\n\n",
       "\u00a0", "a\u00a0b", "\u2003em\u2003space", "\u3000ideographic\u3000space", "\u2028line sep\u2029para sep",
       "\u000bvertical tab\u000cform feed", "\u0085next line", "word " * 30,
       "   leading three", "trailing three   ", "    four spaces of indentation",
       " " * 31 + "x", " " * 32 + "x", " " * 62 + "x", " " * 100]
)

LONG = [
    "a" * 100, "a" * 1000, "ab" * 300, "abc" * 200, "x" * 33 + "y" * 33,
    "pneumonoultramicroscopicsilicovolcanoconiosis",
    "antidisestablishmentarianism" * 5,
    "https://www.example.com/a/very/long/path/to/some/resource/index.html?utm_source=newsletter&utm_medium=email&utm_campaign=spring_sale&session=8f14e45fceea167a5a36dedd4bea2543#section-42",
    "https://github.com/ggml-org/llama.cpp/blob/master/src/llama-vocab.cpp#L1234-L1260",
    "ftp://user:password@ftp.example.org:2121/pub/files/archive.tar.gz",
    "file:///home/user/Documents/My%20Files/report_final_v2(1).pdf",
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==",
    "0123456789abcdef" * 16,
    "deadbeef cafebabe 0badf00d feedface " * 8,
    "/usr/local/lib/python3.12/site-packages/transformers/models/gemma3/modeling_gemma3.py",
    "C:\\Program Files (x86)\\Microsoft Visual Studio\\2022\\Community\\VC\\Tools\\MSVC",
    "$$$$$$$$$$$$$$$$$$$$$$$$$$$$$$$$$$$$$$$$", "----------------------------------------",
    "========================================", "****************************************",
    "________________________________________", "........................................",
    "!!!!!!!!!!????????", "<<<<<<<<>>>>>>>>", "////////\\\\\\\\\\\\\\\\",
    "🙂" * 50, "中" * 100, "ل" * 60,
]

SPECIAL = [
    "<start_of_turn>user\n",
    "<start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>\n",
    "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "</s>", "<s>", "[multimodal]",
    "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>",
    "<unused0>", "<unused42>", "<unused98>", "<unused99>", "<unused6241>",
    "<start_of_tur", "start_of_turn>", "<<start_of_turn>>", "<start_of_turn><end_of_turn>",
    "<start_of_turn> user", "text<bos>text", "a<eos>b<pad>c", "<bos><bos>", "<end_of_turn>\n\n\n",
    "<0x41>", "<0x0A>", "<0xZZ>", "<table><tr><td>cell</td></tr></table>", "<div><span>x</span></div>",
    "<br><hr><p></p>", "<html><body></body></html>", "<h1>Title</h1>", "<img src=\"a.png\">",
    "<|turn>user\nhi<turn|>", "<|channel>thought\n<channel|>", "<|tool_call>call:f{}<tool_call|>",
    "<|im_start|>user\nhi<|im_end|>", "<|endoftext|>", "<|eot_id|>",
    "Use <start_of_turn> to begin a turn and <end_of_turn> to end it.",
    "<start_of_turn>model\n```python\nprint('hi')\n```<end_of_turn>",
    "  <start_of_turn>  ", "\n<start_of_turn>\n", "</s></s>", "<eos></s><pad>",
]

INVALID = [
    b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xa0\xa1", b"\xe2\x28\xa1", b"\xe2\x82\x28", b"\xe2\x82",
    b"\xf0\x9f\x98", b"\xf0\x28\x8c\xbc", b"\xf8\xa1\xa1\xa1\xa1", b"\xc0\xaf", b"\xed\xa0\x80",
    b"abc\x80def", b"hello \xff world", b"\xff\xfeab\xe2\x96", b"caf\xe9", b"\xe4\xb8\xad\xe6\x96",
    b"ok \xf0\x9f\x98\x80 then \xf0\x9f\x98 cut", b"<start_of_turn>\xff<end_of_turn>", b"\x80" * 8,
    b"\xf4\x90\x80\x80", b"a\xc2", b"\xe2\x96\x81\xe2\x96",
]


def random_strings(rng: random.Random, n: int) -> list[str]:
    """Random mixes of characters from many blocks, including whitespace and specials."""
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        " \t\n\r",
        "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
        "àáâãäåæçèéêëìíîïðñòóôõöøùúûüýþÿ",
        "αβγδεζηθικλμνξοπρστυφχψω",
        "абвгдежзийклмнопрстуфхцчшщъыьэюя",
        "你好世界中文字符测试漢字",
        "ひらがなカタカナ",
        "한국어글자",
        "مرحبابالعالم",
        "नमस्तेदुनिया",
        "😀👍🏽🎉❤️🇯🇵",
        "\u0301\u0308\u200d\u200b\u00a0\u3000",
    ]
    out = []
    for _ in range(n):
        length = rng.randint(1, 40)
        s = "".join(rng.choice(rng.choice(pools)) for _ in range(length))
        out.append(s)
    return out


def random_prose(rng: random.Random, n: int) -> list[str]:
    words = " ".join(PROSE).replace("\n", " ").split()
    out = []
    for _ in range(n):
        k = rng.randint(3, 30)
        s = " ".join(rng.choice(words) for _ in range(k))
        if rng.random() < 0.3:
            s = s.upper()
        if rng.random() < 0.3:
            s = s.replace(" ", rng.choice(["  ", "\n", "\t", " \n"]), rng.randint(1, 3))
        out.append(s)
    return out


def main() -> None:
    rng = random.Random(20240315)
    rows: list[dict] = []

    def add(category: str, text: str, special: bool = False) -> None:
        row = {"name": f"{category}-{sum(r['category'] == category for r in rows):03d}",
               "category": category, "text": text}
        if special:
            row["special"] = True
        rows.append(row)

    add("empty", "")
    for s in PROSE:
        add("prose", s)
    for name, s in CODE.items():
        add("code", s)
    for s in NUMBERS:
        add("numbers", s)
    for s in EMOJI:
        add("emoji", s)
    for s in SCRIPTS:
        add("scripts", s)
    for s in COMBINING:
        add("combining", s)
    for s in WHITESPACE:
        add("whitespace", s)
    for s in LONG:
        add("long", s)
    for s in SPECIAL:
        add("special", s, special=True)
    for s in random_prose(rng, 30):
        add("random_prose", s)
    for s in random_strings(rng, 60):
        add("random_unicode", s)
    for i, b in enumerate(INVALID):
        rows.append({"name": f"invalid_utf8-{i:03d}", "category": "invalid_utf8",
                     "b64": base64.b64encode(b).decode(), "invalid_utf8": True})

    names = [r["name"] for r in rows]
    assert len(names) == len(set(names))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} strings to {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
