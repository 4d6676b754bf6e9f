#!/usr/bin/env python3
"""What transformers makes of the tiny models' checkpoints, for tests that
read the same directories with rlx (no Python needed there):

  tests/fixtures/tiny/<name>/hf-tokens.jsonl  ids of every valid-UTF-8 corpus
      string from AutoTokenizer (BOS added, special-token text parsed, as
      transformers always does)
  tests/fixtures/tiny/<name>/hf-chat.jsonl    apply_chat_template renderings

    python3 scripts/tiny/hf_reference.py [--only NAME,...]
"""

import argparse
import json
from pathlib import Path

from transformers import AutoTokenizer

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests/fixtures/tiny"
CORPUS = REPO / "tests/fixtures/tokenizer/corpus.jsonl"
CONVERSATIONS = [
    [{"role": "user", "content": "Hello there"}],
    [{"role": "user", "content": "  Hi \n"}, {"role": "assistant", "content": "Hello!"},
     {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "<start_of_turn> is a token"}, {"role": "assistant", "content": "Yes."}],
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="gemma,gemma2,gemma3")
    args = ap.parse_args()
    corpus = [json.loads(l) for l in CORPUS.read_text().split("\n") if l]
    for name in args.only.split(","):
        hf = TINY / name / "hf"
        tok = AutoTokenizer.from_pretrained(hf)
        with open(TINY / name / "hf-tokens.jsonl", "w") as f:
            for c in corpus:
                if c.get("invalid_utf8"):
                    continue
                ids = tok(c["text"], add_special_tokens=True)["input_ids"]
                f.write(json.dumps({"name": c["name"], "ids": ids}) + "\n")
        with open(TINY / name / "hf-chat.jsonl", "w") as f:
            for conv in CONVERSATIONS:
                for add in (False, True):
                    text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=add)
                    f.write(json.dumps({"messages": conv, "add_generation_prompt": add,
                                        "text": text}) + "\n")
        print(name, "written")


if __name__ == "__main__":
    main()
