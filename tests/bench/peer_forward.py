"""Peers for bench_forward: the same measurement (prefill of a T-token prompt with logits of the
last position, then token-by-token decoding) in Hugging Face transformers (f32, eager attention,
weights dequantized from the same GGUF by transformers' own GGUF loader) and, if installed, in
llama.cpp through llama-cpp-python (Q4_K_M as stored, its own kernels).

Run by tests/bench/bench_forward.sh with the reference venv (see tests/ref/README.md):
    python tests/bench/peer_forward.py GGUF --tokens 128 --threads 2 --decode 32
The prompt ids follow the same generator as bench_forward.c, so both see identical inputs.
"""
import argparse
import os
import resource
import sys
import time


def prompt_ids(T, bos=2):
    s, ids = 12345, []
    for i in range(T):
        s = (s * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        ids.append(bos if i == 0 else 1000 + (s >> 33) % 200000)
    return ids


def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def bench_transformers(path, ids, threads, repeat, decode):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    d, f = os.path.split(path)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    x = torch.tensor([ids])
    best, best_dec = 1e30, 1e30
    with torch.no_grad():
        for _ in range(repeat):
            t0 = time.perf_counter()
            out = model(x, use_cache=True, logits_to_keep=1)
            best = min(best, time.perf_counter() - t0)
            past = out.past_key_values
            t0 = time.perf_counter()
            for k in range(decode):
                out = model(torch.tensor([[ids[k % len(ids)]]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
            best_dec = min(best_dec, time.perf_counter() - t0)
    T = len(ids)
    print(f"transformers {__import__('transformers').__version__} (torch {torch.__version__}, f32)  "
          f"prefill {T} tokens: {best:.3f} s ({T / best:.1f} tokens/s); decode {decode}: "
          f"{decode / best_dec:.1f} tokens/s; peak RSS {peak_mib():.0f} MiB")


def bench_llamacpp(path, ids, threads, repeat, decode):
    try:
        import llama_cpp
    except ImportError:
        print("llama.cpp: llama-cpp-python not installed in this venv (pip install llama-cpp-python)")
        return
    llm = llama_cpp.Llama(model_path=path, n_ctx=len(ids) + decode + 8, n_threads=threads,
                          n_threads_batch=threads, n_batch=512, logits_all=False, verbose=False)
    best, best_dec = 1e30, 1e30
    for _ in range(repeat):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        best = min(best, time.perf_counter() - t0)
        t0 = time.perf_counter()
        for k in range(decode):
            llm.eval([ids[k % len(ids)]])
        best_dec = min(best_dec, time.perf_counter() - t0)
    T = len(ids)
    print(f"llama.cpp (llama-cpp-python {llama_cpp.__version__}, Q4_K_M as stored)  prefill {T} tokens: "
          f"{best:.3f} s ({T / best:.1f} tokens/s); decode {decode}: {decode / best_dec:.1f} tokens/s; "
          f"peak RSS {peak_mib():.0f} MiB")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--peer", choices=["transformers", "llamacpp"], required=True)
    a = ap.parse_args()
    ids = prompt_ids(a.tokens)
    if a.peer == "transformers":
        bench_transformers(a.gguf, ids, a.threads, a.repeat, a.decode)
    else:
        bench_llamacpp(a.gguf, ids, a.threads, a.repeat, a.decode)


if __name__ == "__main__":
    sys.exit(main())
