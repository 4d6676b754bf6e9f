#!/usr/bin/env bash
# Fresh-machine setup: build rlx, fetch the default model, generate text, and
# say what to try next.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p rlx-cli
bash scripts/fetch-model.sh >/dev/null
# The 270M file is a small base model: a story opening, greedy with a
# repetition penalty, shows it at its best.
./target/release/rlx run --raw "Once upon a time, in a small village by the sea," -n 64 --temp 0 --repeat-penalty 1.3
# What was done, and what to try next.
MODEL=${RLX_HOME:-$HOME/.cache/rlx/models}/gemma-3-270m-q4_k_m.gguf
cat <<EOF

Built target/release/rlx (put it on your PATH: export PATH="$PWD/target/release:\$PATH").
The default model is $MODEL
(Gemma 3 270M Q4_K_M). It is a base model: it continues text rather than
following instructions, so give it the start of a text with --raw:
  rlx run --raw "The three primary colours are" -n 32 --temp 0

For chat, fetch an instruction-tuned model from Hugging Face, then talk to it
in the terminal or serve it over HTTP:
  rlx pull unsloth/gemma-3-270m-it-GGUF
  rlx chat -m unsloth/gemma-3-270m-it-GGUF
  rlx serve -m unsloth/gemma-3-270m-it-GGUF &
  curl -s localhost:8080/v1/chat/completions \\
    -d '{"messages":[{"role":"user","content":"Name a colour."}],"max_tokens":32}'

rlx --help lists every command; each command's --help ends with examples.
EOF
