#!/usr/bin/env python3
"""Reference check: the tokenizer of `remat train --save DIR --format hf-gpt2` round-trips every byte.

Trains a one-step model on a text whose vocabulary holds ASCII, control bytes (tab, BEL, CR) and UTF-8
letters of two, three and four bytes ("naïve café", "€", an emoji), saves it as --format hf-gpt2,
loads the directory with transformers.AutoTokenizer and checks that
  - the text encodes to remat's ids (the index of each byte in the model's vocabulary, read from
    model.safetensors' metadata) and decodes back to itself, and every id of the vocabulary
    decodes to its byte;
  - a text with a byte outside the vocabulary ("naïve cafe" with a combining accent, "Z") is refused
    (an exception), as `remat sample --prompt` refuses it;
  - as a control, GPT-2's byte-level BPE files with the same vocabulary (what remat wrote before)
    drop such a byte without a word: the check can fail.

Not run by CI: it needs transformers (pip install transformers; torch is not needed).

  cmake --build build --target remat
  python3 tests/reference/check_hf_tokenizer.py [--build build]
Exit status 0 when every check passes.
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

from transformers import AutoTokenizer

TEXT = "naïve café costs 3 € 😀\tdone\r\n" * 40 + "a bell: \x07\n" + "the quick brown fox jumps over the lazy dog\n" * 10


def vocabulary(directory):
    with open(os.path.join(directory, "model.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        meta = json.loads(f.read(n))["__metadata__"]
    return [int(b) for b in meta["vocabulary"].split(",")]


def gpt2_bpe_files(directory, vocab):
    """What remat wrote before: GPT-2's BPE files without merges, the same ids."""
    def printable(c):
        return 33 <= c <= 126 or 161 <= c <= 172 or 174 <= c <= 255

    def char(b):
        return chr(b) if printable(b) else chr(256 + sum(1 for c in range(b) if not printable(c)))
    os.makedirs(directory)
    json.dump({char(b): i for i, b in enumerate(vocab)}, open(os.path.join(directory, "vocab.json"), "w"))
    open(os.path.join(directory, "merges.txt"), "w").write("#version: 0.2\n")
    json.dump({"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False, "unk_token": None},
              open(os.path.join(directory, "tokenizer_config.json"), "w"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build", help="the build directory (default: build)")
    args = parser.parse_args()
    remat = os.path.join(args.build, "remat")
    ok = True
    with tempfile.TemporaryDirectory() as work:
        corpus = os.path.join(work, "corpus.txt")
        open(corpus, "w", encoding="utf-8").write(TEXT)
        exported = os.path.join(work, "hf")
        subprocess.run([remat, "train", "--data", corpus, "--steps", "1", "--layers", "1", "--width", "8", "--heads",
                        "2", "--seq", "8", "--batch", "2", "--quiet", "--save", exported, "--format", "hf-gpt2"],
                       check=True)
        vocab = vocabulary(exported)
        tokenizer = AutoTokenizer.from_pretrained(exported)
        ids = tokenizer.encode(TEXT)
        expected = [vocab.index(b) for b in TEXT.encode("utf-8")]
        decoded = tokenizer.decode(ids)
        print(f"{len(vocab)} bytes in the vocabulary; {type(tokenizer).__name__}: {len(ids)} ids for {len(expected)} bytes")
        if ids != expected or decoded != TEXT:
            print("FAIL: the text does not round-trip with remat's ids")
            ok = False
        for i, b in enumerate(vocab):  # one id alone: its byte (a lone byte of a UTF-8 letter is no text)
            if b < 0x80 and tokenizer.decode([i]) != chr(b):
                print(f"FAIL: id {i} decodes to {tokenizer.decode([i])!r}, not byte {b}")
                ok = False
        for outside in ["naïve cafe\u0301", "Z"]:
            try:
                got = tokenizer.encode(outside)
                print(f"FAIL: {outside!r} (a byte outside the vocabulary) was encoded as {got}")
                ok = False
            except Exception as e:  # the tokenizers library raises its own exception type
                print(f"ok: {outside!r} refused: {e}")
        sample = subprocess.run([remat, "sample", "--load", exported, "--prompt", "Z", "--tokens", "1"],
                                capture_output=True, text=True)
        print(f"remat sample --prompt Z: exit {sample.returncode}: {sample.stderr.strip()[:120]}")
        ok = ok and sample.returncode != 0
        control = os.path.join(work, "gpt2-bpe")
        gpt2_bpe_files(control, vocab)
        dropped = AutoTokenizer.from_pretrained(control).encode("naïve cafe\u0301")
        print(f"control: GPT-2's BPE files encode 'naïve cafe\\u0301' to {len(dropped)} ids for "
              f"{len('naïve cafe'.encode()) + 2} bytes (the bytes outside dropped without a word)")
        if len(dropped) == len("naïve cafe\u0301".encode()):
            print("FAIL: the control did not drop the byte: the check cannot tell")
            ok = False
    print("check_hf_tokenizer: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
