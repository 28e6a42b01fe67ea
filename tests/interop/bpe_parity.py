"""Encodes strings with transformers' GPT2TokenizerFast on a vocab.json + merges.txt folder and
prints the ids and the decoded texts as JSON; also saves the tokenizer's tokenizer.json (alone)
into a second folder, for the C++ test to load.

usage: bpe_parity.py TOKENIZER_DIR STRINGS_JSON TOKENIZER_JSON_OUT_DIR
"""
import json
import os
import sys

import transformers

folder, strings_file, json_dir = sys.argv[1:4]
strings = json.load(open(strings_file, encoding="utf-8"))
tok = transformers.GPT2TokenizerFast(
    vocab_file=os.path.join(folder, "vocab.json"), merges_file=os.path.join(folder, "merges.txt"))
ids = [tok.encode(s) for s in strings]
decoded = [tok.decode(i, clean_up_tokenization_spaces=False) for i in ids]
os.makedirs(json_dir, exist_ok=True)
tok.backend_tokenizer.save(os.path.join(json_dir, "tokenizer.json"))
print(json.dumps({"ids": ids, "decoded": decoded, "vocab_size": len(tok)}))
