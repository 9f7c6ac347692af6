#!/usr/bin/env python3
"""Subword tokenizers for tessera through Hugging Face `tokenizers`.

  tokenizer.py train TEXT --vocab 4096 --out DIR
      trains a byte-level BPE tokenizer (GPT-2's byte-to-unicode alphabet,
      so every byte sequence is encodable) on the UTF-8 file TEXT, locally
      with nothing downloaded, and writes DIR/<name>.tok, TEXT encoded as a
      tessera token file whose vocabulary is the tokenizer's, its own
      DIR/<name>.tokenizer.json, and DIR/tokenizer.json
  tokenizer.py encode TEXT --tokenizer tokenizer.json --out FILE.tok
      encodes TEXT with an existing tokenizer.json (any model `tokenizers`
      reads: BPE, WordPiece, Unigram) into a tessera token file, with a copy
      of the tokenizer as FILE.tokenizer.json beside it
  tokenizer.py ids --tokenizer tokenizer.json -- TEXT...
      prints the ids of TEXT (one line of integers): how train_llama encodes
      a --prompt for a token file with a tokenizer ("--" keeps a TEXT that
      starts with "-" a text)

The token file is include/tessera/data/token_file.hpp's format: a 64-byte
header ("TSRATOK1", version 1, dtype 1 = uint16 or 2 = uint32, count,
vocabulary, header bytes 64) and the ids, little-endian. A token file's
tokenizer, <name>.tokenizer.json beside <name>.tok (or, for files of older
tessera, tokenizer.json in its folder), is what train_llama decodes its
samples with and what it measures nats per byte with: each token file names
its own, so token files of different tokenizers can share a folder.

Exit status 0 on success, 2 on bad input, 3 when `tokenizers` is missing
(pip install tokenizers).
"""
import argparse
import array
import os
import shutil
import struct
import sys
import tempfile

try:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
except ImportError:
    print("tokenizer.py: the Hugging Face `tokenizers` package is not installed "
          "(pip install tokenizers)", file=sys.stderr)
    sys.exit(3)

MAGIC = b"TSRATOK1"
HEADER = 64


def fail(msg):
    print(f"tokenizer.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def read_text(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        fail(f"cannot read '{path}': {e.strerror}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        fail(f"'{path}' is not UTF-8 text (invalid byte at offset {e.start})")


def write_token_file(path, ids, vocab):
    """tessera's token file, written to a temporary name and renamed."""
    if vocab < 1:
        fail(f"vocabulary size {vocab} must be at least 1")
    big = vocab > 65536
    code, fmt = (2, "I") if big else (1, "H")
    bad = next((i for i, t in enumerate(ids) if not 0 <= t < vocab), None)
    if bad is not None:
        fail(f"token {ids[bad]} at position {bad} is not below the vocabulary size {vocab}")
    header = MAGIC + struct.pack("<IIQQQ", 1, code, len(ids), vocab, HEADER)
    header += b"\0" * (HEADER - len(header))
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".tmp.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header)
            body = array.array(fmt, ids)
            if sys.byteorder != "little":
                body.byteswap()
            f.write(body.tobytes())
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide it from others
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def byte_level_bpe(vocab):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    return tok, trainer


def cmd_train(a):
    if not 256 < a.vocab <= 1 << 20:
        fail(f"--vocab {a.vocab} must be in (256, 1048576]: the 256 byte symbols come first")
    text = read_text(a.text)
    os.makedirs(a.out, exist_ok=True)
    tok, trainer = byte_level_bpe(a.vocab)
    tok.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
    stem = os.path.splitext(os.path.basename(a.text))[0]
    json_path = os.path.join(a.out, "tokenizer.json")
    tok.save(json_path)
    tok.save(os.path.join(a.out, stem + ".tokenizer.json"))
    ids = tok.encode(text).ids
    name = stem + ".tok"
    write_token_file(os.path.join(a.out, name), ids, tok.get_vocab_size())
    print(f"tokenizer.py: trained byte-level BPE, vocabulary {tok.get_vocab_size()}; "
          f"{len(text.encode('utf-8'))} bytes -> {len(ids)} tokens "
          f"({len(text.encode('utf-8')) / max(len(ids), 1):.3f} bytes per token); wrote "
          f"{json_path} and {os.path.join(a.out, name)}")


def cmd_encode(a):
    try:
        tok = Tokenizer.from_file(a.tokenizer)
    except Exception as e:  # tokenizers raises its own exception type
        fail(f"cannot read tokenizer '{a.tokenizer}': {e}")
    text = read_text(a.text)
    ids = tok.encode(text).ids
    write_token_file(a.out, ids, tok.get_vocab_size())
    own = os.path.splitext(os.path.abspath(a.out))[0] + ".tokenizer.json"
    if os.path.abspath(a.tokenizer) != own:
        shutil.copyfile(a.tokenizer, own)
    print(f"tokenizer.py: {len(ids)} tokens, vocabulary {tok.get_vocab_size()} -> {a.out}")


def cmd_ids(a):
    tok = Tokenizer.from_file(a.tokenizer)
    print(" ".join(str(i) for i in tok.encode(" ".join(a.text)).ids))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train a byte-level BPE tokenizer and encode the text")
    t.add_argument("text")
    t.add_argument("--vocab", type=int, default=4096)
    t.add_argument("--out", required=True, help="folder for tokenizer.json and the token file")
    e = sub.add_parser("encode", help="encode text with an existing tokenizer.json")
    e.add_argument("text")
    e.add_argument("--tokenizer", required=True)
    e.add_argument("--out", required=True)
    i = sub.add_parser("ids", help="print the ids of a text")
    i.add_argument("--tokenizer", required=True)
    i.add_argument("text", nargs="+")
    a = ap.parse_args()
    {"train": cmd_train, "encode": cmd_encode, "ids": cmd_ids}[a.cmd](a)


if __name__ == "__main__":
    main()
