"""Loads a `tilegrad export --format hf` folder into transformers (AutoModelForCausalLM) and prints, as JSON, what the
C++ test compares with tilegrad: the loading report, the mean cross-entropy of the given tokens
and the greedy continuation.

usage: hf_parity.py DIR TOKENS_FILE N_NEW
TOKENS_FILE: one line of ids (the inputs), one line of ids (the targets), one line of ids (the prompt).
"""
import json
import sys
import warnings

import torch
import transformers

folder, tokens_file, n_new = sys.argv[1], sys.argv[2], int(sys.argv[3])
lines = [list(map(int, l.split())) for l in open(tokens_file).read().splitlines()]
inputs, targets, prompt = lines[0], lines[1], lines[2]

transformers.logging.set_verbosity_warning()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    # GPT2LMHeadModel for learned positions, GPTNeoXForCausalLM for RoPE: config.json says which.
    model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
model.eval()
torch.manual_seed(0)
with torch.no_grad():
    logits = model(torch.tensor([inputs])).logits[0]
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor(targets)).item()
    ids = list(prompt)
    for _ in range(n_new):
        ctx = ids[-model.config.max_position_embeddings:]
        ids.append(int(model(torch.tensor([ctx])).logits[0, -1].argmax()))
print(json.dumps({
    "missing": info["missing_keys"],
    "unexpected": info["unexpected_keys"],
    "mismatched": [list(map(str, m)) for m in info["mismatched_keys"]],
    "errors": info["error_msgs"],
    "class": type(model).__name__,
    "tied": bool(model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()),
    "loss": loss,
    "greedy": ids[len(prompt):],
    "warnings": [str(w.message) for w in caught],
}))
