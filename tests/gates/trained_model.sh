#!/usr/bin/env bash
# trained_model.sh — llama.cpp runs the trained model (models/, tools/train) exactly as the
# PyTorch graph it was trained with: same perplexity on the committed validation excerpt
# (relative difference < 2e-4: at least the same 3 significant digits; measured 1.7e-5 on the
# 3258-step model) and the same greedy tokens.
#
# No torch needed: the PyTorch side ran once (tools/train/make-reference.sh) and wrote
# tests/data/trained/reference.json — perplexity + greedy tokens for the Q8_0 and Q4_K_M files,
# computed by tools/train/model.py on the dequantized tensors (the values llama.cpp uses).
# llama.cpp's CPU matmuls quantize activations for quantized weights, so the exact check runs
# on an F32 copy made by Debian's llama-quantize (--allow-requantize ... F32: dequantized, not
# re-rounded); the quantized files themselves must agree within 1 %.
# Negative controls: the perplexity comparison must FAIL with top-3 routing instead of top-4
# (--override-kv expert_used_count) and with another RoPE base.
# Env (set by CTest): MOESTREAM_SRC, LLAMA_TOOL, MOESTREAM_TEST_MODELS (scratch dir).
set -euo pipefail
src="${MOESTREAM_SRC:?}"
py="${MOESTREAM_PYTHON:-/usr/bin/python3}"  # Debian's: a PATH shim can take 0.3 s a start
tool="${LLAMA_TOOL:-$src/scripts/llama-tool}"
ref="$src/tests/data/trained/reference.json"
text="$src/tests/data/trained/val-excerpt.txt"
scratch="${MOESTREAM_TEST_MODELS:-/tmp}/trained-gate.$$"
mkdir -p "$scratch"
trap 'rm -rf "$scratch"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

refget() {  # refget MODELKEY FIELD
  "$py" -c 'import json,sys; r=json.load(open(sys.argv[1]))[sys.argv[2]]; v=r[sys.argv[3]]; print(" ".join(map(str,v)) if isinstance(v,list) else v)' "$ref" "$1" "$2"
}
ppl_of() {  # ppl_of MODEL [extra llama-perplexity args] -> prints the final PPL
  local m="$1"; shift
  local try v
  # Known flake (unexplained, seen 3 times under parallel load): llama-perplexity exits 0
  # without its "Final estimate" line. Then its log goes to stderr and it runs once more.
  for try in 1 2; do
    "$tool" llama-perplexity -m "$m" -f "$text" -c "$(refget q8_0 ctx)" -b 2048 -t 2 \
      --no-warmup -lm mmap --no-repack -fit off "$@" > "$scratch/ppl.log" 2>&1 \
      || { tail -20 "$scratch/ppl.log" >&2; fail "llama-perplexity failed on $m"; }
    v="$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$scratch/ppl.log" | tail -1)"
    [ -n "$v" ] && { echo "$v"; return 0; }
    echo "trained_model: llama-perplexity printed no final PPL (try $try); its log ends:" >&2
    tail -15 "$scratch/ppl.log" >&2
  done
  fail "llama-perplexity gave no final PPL on $m"
}
tol=2e-4  # the exact check's relative tolerance; the negative controls must exceed it
close() {  # close A B RELTOL -> exit 0 if |A-B|/B < RELTOL
  "$py" -c 'import sys; a,b,t=map(float,sys.argv[1:]); sys.exit(0 if abs(a-b)/b < t else 1)' "$1" "$2" "$3"
}
greedy_ids() {  # greedy_ids MODEL N PROMPT [extra args] -> byte ids of the generated text
  local m="$1" n="$2" p="$3"; shift 3
  local try v
  # Known flake of the tool, like llama-perplexity's above: under load llama-completion has
  # exited 0 with the end of its text missing (63 of 64 bytes, once in a fresh-clone run).
  # Then its log goes to stderr and it runs once more.
  for try in 1 2; do
    "$tool" llama-completion -m "$m" -p "$p" -n "$n" "$@" --temp 0 -s 1 -no-cnv --no-warmup \
      -lm mmap --no-repack -t 2 -fit off --ignore-eos --no-display-prompt -c 512 \
      2> "$scratch/gen.log" > "$scratch/gen.out" || { tail -20 "$scratch/gen.log" >&2; fail "llama-completion failed"; }
    # one byte per generated token (byte vocab; control tokens' output rows never win greedy);
    # llama-completion prints a newline of its own after the text: keep the first N bytes
    v="$("$py" -c 'import sys; b=open(sys.argv[1],"rb").read(); n=int(sys.argv[2]); print(" ".join(str(x) for x in b[:n]) if len(b) >= n else "short-output:%d" % len(b))' "$scratch/gen.out" "$n")"
    case "$v" in
      short-output:*)
        echo "trained_model: llama-completion printed $v (try $try); its log ends:" >&2
        tail -15 "$scratch/gen.log" >&2 ;;
      *) break ;;
    esac
  done
  echo "$v"
}

[ -f "$ref" ] && [ -f "$text" ] || fail "missing $ref or $text"

# The byte-level vocab: llama.cpp must turn the text into exactly its bytes (the token ids
# PyTorch trained on and scores here), multi-byte UTF-8, tabs and runs of spaces included.
# (--no-parse-special, as llama-perplexity tokenizes: "<|endoftext|>" in text stays bytes.)
for t in "$text" "$src/tests/data/trained/tokenizer-bytes.txt"; do
  "$tool" llama-tokenize -m "$src/models/$(refget q8_0 model)" -f "$t" --ids --no-parse-special --log-disable \
    2> "$scratch/tok.log" | tail -1 > "$scratch/tok.ids" || fail "llama-tokenize failed on $t"
  "$py" -c 'import sys, json; ids=json.loads(open(sys.argv[1]).read()); b=list(open(sys.argv[2],"rb").read()); sys.exit(0 if ids==b else 1)' \
    "$scratch/tok.ids" "$t" || fail "llama.cpp does not tokenize $t into its bytes"
  echo "tokenizer: $(basename "$t"): $(wc -c < "$t") bytes -> the same $(wc -c < "$t") token ids"
done
checked=0
for key in q8_0 q4_k_m; do
  model="$src/models/$(refget "$key" model)"
  [ -f "$model" ] || fail "model $model missing"
  sha="$(sha256sum "$model" | cut -d' ' -f1)"
  [ "$sha" = "$(refget "$key" model_sha256)" ] \
    || fail "$model changed since reference.json was made (re-run tools/train/make-reference.sh)"
  want="$(refget "$key" ppl)"

  f32="$scratch/$key-f32.gguf"
  "$tool" llama-quantize --allow-requantize "$model" "$f32" F32 > "$scratch/q.log" 2>&1 \
    || { tail -5 "$scratch/q.log" >&2; fail "llama-quantize to F32 failed"; }
  got="$(ppl_of "$f32")"
  echo "$key: PyTorch PPL $want, llama.cpp (F32 copy) PPL $got"
  close "$got" "$want" "$tol" || fail "$key: perplexity differs: llama.cpp $got vs PyTorch $want"

  got_q="$(ppl_of "$model")"
  echo "$key: llama.cpp on the quantized file PPL $got_q"
  close "$got_q" "$want" 1e-2 || fail "$key: quantized-file perplexity $got_q not within 1 % of $want"

  n="$(refget "$key" n_predict)"; prompt="$(refget "$key" prompt)"
  want_ids="$(refget "$key" greedy_tokens)"
  got_ids="$(greedy_ids "$f32" "$n" "$prompt")"
  [ "$got_ids" = "$want_ids" ] || fail "$key: greedy tokens differ
 llama.cpp: $got_ids
 PyTorch:   $want_ids"
  echo "$key: greedy $n tokens identical: $(refget "$key" greedy_text | head -c 80 | tr '\n' ' ')"

  if [ "$key" = q8_0 ]; then  # negative controls: a different graph must be caught
    bad="$(ppl_of "$f32" --override-kv qwen3moe.expert_used_count=int:3)"
    echo "control: top-3 routing PPL $bad"
    close "$bad" "$want" "$tol" && fail "control: top-3 routing ($bad) was not told apart from $want"
    bad="$(ppl_of "$f32" --rope-freq-base 1000000)"
    echo "control: RoPE base 1e6 PPL $bad"
    close "$bad" "$want" "$tol" && fail "control: RoPE base 1e6 ($bad) was not told apart from $want"
    # (no greedy control: this briefly trained model's greedy text is a short loop (" to the
    # set the set ...") that top-3 routing may not change; the perplexity controls above show
    # the test can fail. With more training the 4th expert's weight shrank: top-3 routing
    # moved the perplexity by 8.5e-4 relative, under the 1e-3 this gate used to allow.)
  fi
  checked=$((checked + 1))
done
echo "trained_model: $checked models agree with PyTorch"
