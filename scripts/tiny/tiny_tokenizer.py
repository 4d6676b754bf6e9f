"""A tiny, deterministic Gemma-style SentencePiece tokenizer for the tiny test models.

Pieces: <pad>=0 <eos>=1 <bos>=2 <unk>=3, <mask>=4 <start_of_turn>=5 <end_of_turn>=6 (user-defined
in the SentencePiece model, marked special in tokenizer_config.json, so the GGUF converter types
them CONTROL), then the 256 byte-fallback pieces <0x00>..<0xFF> (7..262), then learned BPE pieces.

Like Gemma: identity normalizer, no dummy prefix, whitespace kept as is, digits split.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

SPECIALS = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4, "<start_of_turn>": 5, "<end_of_turn>": 6}
FIRST_BYTE = 7

_WORDS = """the of and to in is was for on that with as by at from it an be this are which or
his had not but have were one all their they has been more new can will its who would about
there when other out up into time also some than two only first them after may over most any
model token layer weight tensor window attention head vector matrix value key query norm scale
rope theta sliding global local expert router gate embedding logits softmax prompt engine cache
quick brown fox jumps lazy dog river mountain city north south east west small large green red
blue yellow happy little water light house tree stone bread music paper garden winter summer
morning evening number letter story reader writer teacher student market village station road
""".split()


def _corpus(seed: int = 1234, n_lines: int = 4000) -> str:
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n_lines):
        n = int(rng.integers(4, 16))
        words = [_WORDS[int(rng.integers(len(_WORDS)))] for _ in range(n)]
        if rng.random() < 0.3:
            words[0] = words[0].capitalize()
        if rng.random() < 0.2:
            words.insert(int(rng.integers(len(words))), str(int(rng.integers(0, 10000))))
        s = " ".join(words)
        s += [".", ",", "?", "!", ":", ";", ""][int(rng.integers(7))]
        if rng.random() < 0.1:
            s = "    " + s  # indentation runs
        if rng.random() < 0.05:
            s = "<start_of_turn>user\n" + s + "<end_of_turn>"
        lines.append(s)
    return "\n".join(lines) + "\n"


def train_spm(out_dir: Path, vocab_size: int, seed: int = 1234) -> Path:
    import sentencepiece as spm

    out_dir.mkdir(parents=True, exist_ok=True)
    text = _corpus(seed)
    spm.set_random_generator_seed(seed)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text.splitlines()),
        model_writer=model,
        model_type="bpe",
        vocab_size=vocab_size,
        character_coverage=1.0,
        byte_fallback=True,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        normalization_rule_name="identity",
        add_dummy_prefix=False,
        remove_extra_whitespaces=False,
        split_by_whitespace=True,
        pad_id=0, eos_id=1, bos_id=2, unk_id=3,
        pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>",
        user_defined_symbols=["<mask>", "<start_of_turn>", "<end_of_turn>"],
        num_threads=1,
        shuffle_input_sentence=False,
        input_sentence_size=0,
        minloglevel=2,
    )
    path = out_dir / "tokenizer.model"
    path.write_bytes(model.getvalue())
    sp = spm.SentencePieceProcessor(model_file=str(path))
    assert sp.get_piece_size() == vocab_size, sp.get_piece_size()
    for piece, i in SPECIALS.items():
        assert sp.id_to_piece(i) == piece, (i, sp.id_to_piece(i))
    assert sp.id_to_piece(FIRST_BYTE) == "<0x00>" and sp.id_to_piece(FIRST_BYTE + 255) == "<0xFF>"
    return path


def tokenizer_config(vocab_size: int) -> dict:
    return {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": {
            str(i): {"content": p, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for p, i in SPECIALS.items()
        },
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "mask_token": "<mask>",
        "additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"],
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1024,
        "sp_model_kwargs": {},
        "spaces_between_special_tokens": False,
        "tokenizer_class": "GemmaTokenizer",
        "use_default_system_prompt": False,
        "chat_template": (
            "{{ bos_token }}{% for message in messages %}"
            "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
            "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
        ),
    }


def special_tokens_map() -> dict:
    return {
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
        "mask_token": "<mask>",
        "additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"],
    }


def write_tokenizer_files(model_dir: Path, spm_path: Path, vocab_size: int, with_json: bool = False) -> None:
    """Copy tokenizer.model and write the config files; with_json also writes tokenizer.json
    (a byte-fallback BPE built from the SentencePiece model), which the gemma4 converter needs."""
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "tokenizer.model").write_bytes(spm_path.read_bytes())
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(vocab_size), indent=2) + "\n")
    (model_dir / "special_tokens_map.json").write_text(json.dumps(special_tokens_map(), indent=2) + "\n")
    if with_json:
        (model_dir / "tokenizer.json").write_text(spm_to_tokenizer_json(spm_path))


def spm_to_tokenizer_json(spm_path: Path) -> str:
    """Build an HF tokenizer.json (BPE, byte_fallback, Gemma-style decoder) from the SPM model."""
    import sentencepiece as spm
    from tokenizers import Tokenizer, decoders, normalizers, AddedToken
    from tokenizers.models import BPE

    sp = spm.SentencePieceProcessor(model_file=str(spm_path))
    n = sp.get_piece_size()
    vocab = {sp.id_to_piece(i): i for i in range(n)}
    # merges, the way transformers' SentencePieceExtractor derives them: every piece that is the
    # concatenation of two pieces, ordered by the score (rank) of the merged piece.
    merges = []
    for piece, pid in vocab.items():
        if sp.is_control(pid) or sp.is_byte(pid) or sp.is_unknown(pid) or piece in SPECIALS:
            continue
        cands = []
        for k in range(1, len(piece)):
            l, r = piece[:k], piece[k:]
            if l in vocab and r in vocab:
                cands.append((vocab[l], vocab[r], l, r))
        for _, _, l, r in sorted(cands):
            merges.append((pid, l, r))
    merges.sort(key=lambda t: (t[0],))
    merges = [(l, r) for _, l, r in merges]
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True, dropout=None))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(p, special=True, normalized=False) for p in SPECIALS])
    return tok.to_str(pretty=True) + "\n"
