#!/usr/bin/env python3
"""Writes the seed corpus of the tokenizer fuzz target (tests/fuzz/
corpus-tokenizer): small tokenizer.json files in the shapes the real ones
have (GPT-2 / Llama 3 / Qwen byte-level BPE, Llama 2 SentencePiece-style
BPE with byte fallback, a Metaspace pre-tokenizer) and one of each way to
be refused, each followed by a NUL and a text to encode, under 64 KiB.

    tests/fuzz/make_corpus_tokenizer.py [DIR]   (DIR defaults to tests/fuzz)"""
import json
import os
import sys

top = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
D = os.path.join(top, "corpus-tokenizer")
os.makedirs(D, exist_ok=True)
TEXT = "Hello world, it's 2026!  12345\n\u65e5\u672c\u8a9e caf\u00e9 \U0001F600 <|endoftext|> <s>x</s>"


def put(name, tok, text=TEXT):
    if not isinstance(tok, bytes):
        tok = (tok if isinstance(tok, str) else json.dumps(tok)).encode()
    data = tok + b"\0" + text.encode()
    assert len(data) < 65536, name
    with open(os.path.join(D, name), "wb") as f:
        f.write(data)


def bytes_to_unicode():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


ch = bytes_to_unicode()
LLAMA3_RE = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
             "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def bytelevel(words="hello world the it's 2026", pre=None, norm=None, post=None, merges_as_pairs=True,
              ignore_merges=False):
    vocab = {ch[b]: b for b in range(256)}
    merges = []
    for w in words.split():
        s = [ch[c] for c in (" " + w).encode()]
        while len(s) > 1:
            merges.append([s[0], s[1]] if merges_as_pairs else s[0] + " " + s[1])
            vocab.setdefault(s[0] + s[1], len(vocab))
            s = [s[0] + s[1]] + s[2:]
    eot = len(vocab)
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": eot, "content": "<|endoftext|>", "special": True,
                              "lstrip": False, "rstrip": False, "normalized": False}],
            "normalizer": norm,
            "pre_tokenizer": pre or {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
            "post_processor": post or {"type": "ByteLevel"},
            "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": vocab, "merges": merges, "ignore_merges": ignore_merges}}


def spm(meta_pre=False):
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    merges = []
    for w in ["\u2581hello", "\u2581world", "\u2581the", "\u2581\u2581"]:
        s = list(w)
        for c in s:
            vocab.setdefault(c, len(vocab))
        while len(s) > 1:
            merges.append(s[0] + " " + s[1])
            vocab.setdefault(s[0] + s[1], len(vocab))
            s = [s[0] + s[1]] + s[2:]
    added = [{"id": i, "content": c, "special": True, "lstrip": False, "rstrip": False,
              "normalized": False} for c, i in (("<unk>", 0), ("<s>", 1), ("</s>", 2))]
    t = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
         "normalizer": {"type": "Sequence", "normalizers": [
             {"type": "Prepend", "prepend": "\u2581"},
             {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
         "pre_tokenizer": None,
         "post_processor": {"type": "TemplateProcessing",
                            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                       {"Sequence": {"id": "A", "type_id": 0}}],
                            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
         "decoder": {"type": "Sequence", "decoders": [
             {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
             {"type": "ByteFallback"}, {"type": "Fuse"},
             {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
         "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": True, "byte_fallback": True,
                   "vocab": vocab, "merges": merges}}
    if meta_pre:
        t["normalizer"] = None
        t["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                              "split": True}
        t["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first"}
    return t


put("valid_gpt2.json", bytelevel())
put("valid_gpt2_old_merges.json", bytelevel(merges_as_pairs=False))
put("valid_llama3.json", bytelevel(pre={"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": LLAMA3_RE}, "behavior": "Isolated", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}, ignore_merges=True))
put("valid_qwen_nfc.json", bytelevel(norm={"type": "NFC"}, pre={"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": LLAMA3_RE.replace("{1,3}", "")}, "behavior": "Isolated"},
    {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}))
put("template_id_past_vocab.json", bytelevel(post={
    "type": "TemplateProcessing", "single": [{"Sequence": {"id": "A"}}, {"SpecialToken": {"id": "<|endoftext|>"}}],
    "special_tokens": {"<|endoftext|>": {"ids": [256 + 30]}}}))
put("valid_llama2.json", spm())
put("valid_metaspace.json", spm(meta_pre=True))
put("valid_lowercase_strip.json", bytelevel(norm={"type": "Sequence", "normalizers": [
    {"type": "Lowercase"}, {"type": "Strip", "strip_left": True, "strip_right": True},
    {"type": "NFKC"}, {"type": "Replace", "pattern": {"Regex": "\\d+"}, "content": "#"}]}))
put("valid_split_removed.json", bytelevel(pre={"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed"},
    {"type": "ByteLevel", "add_prefix_space": True, "use_regex": False}]}))
put("valid_split_merged.json", bytelevel(pre={"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "\\s"}, "behavior": "MergedWithNext"},
    {"type": "Split", "pattern": {"Regex": ","}, "behavior": "MergedWithPrevious"},
    {"type": "ByteLevel", "use_regex": False}]}))
put("valid_gpt4o_invert.json", bytelevel(pre={"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": LLAMA3_RE}, "behavior": "Removed", "invert": True},
    {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}))
# refusals
put("invert_isolated.json", bytelevel(pre={"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Isolated",
                                           "invert": True}))
put("not_json.json", '{"model": {"type": "BPE", "vocab": {')
put("array.json", "[1, 2, 3]")
put("no_model.json", {"version": "1.0"})
put("unigram.json", {"model": {"type": "Unigram", "vocab": [["a", 0.0]]}})
put("bert_normalizer.json", dict(bytelevel(), normalizer={"type": "BertNormalizer"}))
put("bad_regex.json", bytelevel(pre={"type": "Split", "pattern": {"Regex": "(unclosed"}}))
put("contiguous.json", bytelevel(pre={"type": "Split", "pattern": {"String": " "}, "behavior": "Contiguous"}))
put("dropout.json", dict(bytelevel(), model=dict(bytelevel()["model"], dropout=0.1)))
put("bad_merge.json", dict(bytelevel(), model=dict(bytelevel()["model"], merges=["nospace"])))
put("vocab_id_string.json", {"model": {"type": "BPE", "vocab": {"a": "0"}, "merges": []}})
put("vocab_dup_id.json", {"model": {"type": "BPE", "vocab": {"a": 0, "b": 0}, "merges": []}})
put("vocab_huge_id.json", {"model": {"type": "BPE", "vocab": {"a": 2**30}, "merges": []}})
put("template_unknown.json", bytelevel(post={"type": "TemplateProcessing",
                                             "single": [{"SpecialToken": {"id": "<x>"}}], "special_tokens": {}}))
put("truncation.json", dict(bytelevel(), truncation={"max_length": 8}))
put("no_unk_no_fallback.json", {"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}, "abc")
put("added_not_array.json", dict(bytelevel(), added_tokens={"id": 0, "content": "x"}))
put("bert_cls_not_array.json", bytelevel(post={"type": "BertProcessing", "cls": "[CLS]", "sep": {"a": 1}}))
# A replacement that is not UTF-8 (a raw 0xff in the JSON string): it would
# go into the text the pre-tokenizer's regex then matches unchecked.
for name, obj in (("replace_not_utf8.json", bytelevel(norm={"type": "Replace", "pattern": {"Regex": "\\d+"},
                                                           "content": "@FF@"})),
                  ("prepend_not_utf8.json", bytelevel(norm={"type": "Prepend", "prepend": "@FF@"})),
                  ("metaspace_not_utf8.json", bytelevel(pre={"type": "Metaspace", "replacement": "@FF@"}))):
    put(name, json.dumps(obj).encode().replace(b"@FF@", b"\xffx"))
