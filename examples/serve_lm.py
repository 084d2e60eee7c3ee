"""Serve the decoder-only LM (Flax NNX) to a stream of requests: prefill
each prompt into a KV cache, then decode one token per step, with requests
of varying prompt and output lengths arriving and finishing as it runs.

    python examples/serve_lm.py --requests 16
    python examples/serve_lm.py --cache slots --slots 4 --requests 32
    python examples/serve_lm.py --requests 16 --verify      # check the cache
    python examples/serve_lm.py --requests 64 --trace serve.jsonl.gz

The scheduler works at the granularity of one decode step (continuous
batching): between two steps, requests that have arrived join, up to
--slots at once, and requests that have produced their tokens leave. The
weights are freshly initialised (the allocation pattern does not depend on
them) and decoding is greedy, so a run is a function of --seed.

Two ways to hold the KV cache:

* grow (default): every request owns one cache buffer, [layers, 2,
  capacity, heads, head_dim], sized at prefill to its prompt rounded up to
  --cache-block positions. When a decode step would pass the end, a new
  buffer one block longer is made, the cache copied into it and the old one
  freed. A finished request frees its cache. Each request decodes in its
  own launch, with its cache donated to the step.
* slots: one cache for --slots requests of up to --max-len positions,
  allocated once. A request is prefilled into a free slot; every step
  decodes all slots in one launch (idle slots compute and are ignored).

--trace records the GPU-faithful allocation trace that `jaxlake replay`
reads; --verify recomputes every finished request without the cache (the
model's own causal forward over the whole sequence) and fails when a token
differs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402

CACHE_MODES = ("grow", "slots")


def _range(text: str) -> Tuple[int, int]:
    """MIN,MAX (or one number N, meaning N,N), both 1 or more."""
    parts = [p for p in text.replace(" ", "").split(",") if p]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not MIN,MAX (whole numbers), e.g. 8,48") from None
    if len(values) == 1:
        values = values * 2
    if len(values) != 2 or values[0] < 1 or values[0] > values[1]:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give MIN,MAX with 1 <= MIN <= MAX, e.g. 8,48")
    return values[0], values[1]


def parser() -> argparse.ArgumentParser:
    import _lm
    p = argparse.ArgumentParser(prog="serve_lm.py", description=__doc__,
                                formatter_class=_lm.Formatter)
    m = p.add_argument_group("model")
    m.add_argument("--preset", default="tiny", choices=list(_lm.PRESETS),
                   help="model size (default: tiny)")
    m.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                   help="compute and cache dtype (default: bfloat16 on a "
                        "GPU or when recording a --trace, float32 "
                        "elsewhere)")
    m.add_argument("--max-len", type=_lm.positive_int, default=128,
                   help="longest sequence, prompt plus output: the model's "
                        "positions and a slot's length (default: 128)")
    s = p.add_argument_group("requests")
    s.add_argument("--requests", type=_lm.positive_int, default=16,
                   help="requests to serve (default: 16)")
    s.add_argument("--prompt-len", type=_range, default=(8, 48),
                   metavar="MIN,MAX",
                   help="prompt lengths, drawn uniformly (default: 8,48)")
    s.add_argument("--new-tokens", type=_range, default=(4, 48),
                   metavar="MIN,MAX",
                   help="tokens to generate per request, drawn uniformly "
                        "(default: 4,48)")
    s.add_argument("--arrival-every", type=float, default=2.0,
                   help="mean decode steps between two arrivals; 0: all "
                        "arrive at once (default: 2)")
    s.add_argument("--seed", type=int, default=0,
                   help="seed of the weights and of the requests "
                        "(default: 0)")
    e = p.add_argument_group("engine")
    e.add_argument("--cache", default="grow", choices=CACHE_MODES,
                   help="grow: a cache per request that grows by "
                        "--cache-block and is freed when it finishes; "
                        "slots: one cache of --slots fixed slots "
                        "(default: grow)")
    e.add_argument("--slots", type=_lm.positive_int, default=4,
                   help="requests served at once (default: 4)")
    e.add_argument("--cache-block", type=_lm.positive_int, default=16,
                   help="positions a cache grows by; prompts are padded to "
                        "a multiple of it (default: 16)")
    e.add_argument("--verify", action="store_true",
                   help="recompute each request without the cache and fail "
                        "when a token differs (default: off)")
    r = _lm.add_jaxlake_args(p)
    r.add_argument("--compile-only", action="store_true",
                   help="with --trace: compile for the GPU, run nothing "
                        "(default: off)")
    r.add_argument("--trace-name", default=None,
                   help="the trace's name (default: from the options)")
    o = p.add_argument_group("output")
    o.add_argument("--log-json", default=None, metavar="PATH",
                   help="append one JSON line per finished request and a "
                        "memory summary (default: none)")
    o.add_argument("--no-progress", action="store_true",
                   help="no progress lines (default: a line per 16 steps "
                        "on stderr)")
    return p


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    import _lm
    longest = args.prompt_len[1] + args.new_tokens[1]
    if longest > args.max_len:
        p.error(f"--prompt-len up to {args.prompt_len[1]} plus --new-tokens "
                f"up to {args.new_tokens[1]} is {longest} positions, over "
                f"--max-len {args.max_len}: raise --max-len to {longest} or "
                "shorten the ranges")
    padded = -(-args.prompt_len[1] // args.cache_block) * args.cache_block
    if padded > args.max_len:
        p.error(f"a prompt of {args.prompt_len[1]} padded to --cache-block "
                f"{args.cache_block} is {padded} positions, over --max-len "
                f"{args.max_len}: use a --cache-block that divides "
                f"--max-len, or a larger --max-len")
    if args.arrival_every < 0:
        p.error(f"--arrival-every {args.arrival_every} is negative: give 0 "
                "(all at once) or a mean gap in steps")
    if args.compile_only and not args.trace:
        p.error("--compile-only records a trace without running: it needs "
                "--trace OUT")
    if args.compile_only and args.verify:
        p.error("--compile-only runs nothing, so there is nothing to "
                "--verify: drop one")
    for flag, path in (("--trace", args.trace),
                       ("--log-json", args.log_json)):
        if path:
            _lm.writable(p, flag, path)


# -- requests ----------------------------------------------------------------


@dataclasses.dataclass
class Request:
    index: int
    arrival: int              # the decode step at which it arrives
    prompt: Any               # np.ndarray of int32 tokens
    new_tokens: int
    started: int = -1         # the step it was admitted
    finished: int = -1
    slot: int = -1
    cache: Any = None         # grow: its own cache buffer
    count: int = 0            # tokens generated so far
    # grow: the device's token of each step, kept until the request ends
    tokens: List[Any] = dataclasses.field(default_factory=list)
    generated: List[int] = dataclasses.field(default_factory=list)


def make_requests(args: argparse.Namespace, data: Any) -> List[Request]:
    """The request stream: a function of --seed and the ranges."""
    import numpy as np
    rng = np.random.default_rng([args.seed, 33])
    out, arrival = [], 0
    for i in range(args.requests):
        if i and args.arrival_every > 0:
            arrival += int(rng.poisson(args.arrival_every))
        plen = int(rng.integers(args.prompt_len[0], args.prompt_len[1] + 1))
        new = int(rng.integers(args.new_tokens[0], args.new_tokens[1] + 1))
        start = int(rng.integers(0, len(data) - plen))
        out.append(Request(i, arrival, data[start:start + plen].astype(
            np.int32), new))
    return out


# -- the model with a KV cache -----------------------------------------------


def build(cfg: Any) -> Dict[str, Any]:
    """The jitted functions of the engine, over the LM's State. A cache is
    [layers, 2 (keys, values), batch, capacity, heads, head_dim]."""
    import jax
    import jax.numpy as jnp
    from _model import LM
    from flax import nnx

    graphdef, _ = nnx.split(nnx.eval_shape(lambda: LM(cfg, nnx.Rngs(0))))
    dtype = jnp.dtype(cfg.dtype)
    hd = cfg.d_model // cfg.heads

    def forward(state: Any, tokens: jax.Array, start: jax.Array,
                cache: jax.Array) -> Tuple[jax.Array, jax.Array]:
        """Logits [B, T, vocab] of `tokens` [B, T] placed at positions
        start[b] + t, attending to the cache, which gets their keys and
        values written in."""
        model = nnx.merge(graphdef, state)
        b, t = tokens.shape
        cap = cache.shape[3]
        pos = start[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
        x = (model.embed(tokens) + model.pos_embed[
            jnp.minimum(pos, cfg.max_len - 1)]).astype(dtype)
        # A query at position p sees the keys at positions 0..p.
        mask = jnp.arange(cap)[None, None, :] <= pos[:, :, None]
        write = jax.vmap(lambda c, new, s: jax.lax.dynamic_update_slice(
            c, new, (jnp.minimum(s, cap - t), 0, 0)))
        for layer, block in enumerate(model.blocks):
            h = block.norm_attn(x)
            att = block.attn
            q, k, v = (p(h).reshape(b, t, cfg.heads, hd)
                       for p in (att.q, att.k, att.v))
            keys = write(cache[layer, 0], k.astype(cache.dtype), start)
            values = write(cache[layer, 1], v.astype(cache.dtype), start)
            cache = cache.at[layer, 0].set(keys).at[layer, 1].set(values)
            scores = jnp.einsum("bthd,bchd->bhtc", q, keys.astype(q.dtype),
                                preferred_element_type=jnp.float32)
            scores = jnp.where(mask[:, None], scores / math.sqrt(hd),
                               -jnp.inf)
            weights = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
            o = jnp.einsum("bhtc,bchd->bthd", weights, values.astype(q.dtype))
            x = x + att.out(o.reshape(b, t, cfg.d_model)).astype(x.dtype)
            x = x + block.mlp(block.norm_mlp(x)).astype(x.dtype)
        x = model.norm_out(x)
        return model.embed.attend(x.astype(dtype)).astype(jnp.float32), cache

    def init(key: jax.Array) -> Any:
        return nnx.state(LM(cfg, nnx.Rngs(key)))

    def empty(batch: int, cap: int) -> jax.Array:
        return jnp.zeros((cfg.layers, 2, batch, cap, cfg.heads, hd), dtype)

    def prefill(state: Any, tokens: jax.Array, length: jax.Array
                ) -> Tuple[jax.Array, jax.Array]:
        """grow: a new cache as long as the padded prompt [1, P]; returns
        the first generated token [1] and the cache."""
        cache = empty(1, tokens.shape[1])
        logits, cache = forward(state, tokens, jnp.zeros((1,), jnp.int32),
                                cache)
        last = jnp.take_along_axis(logits, (length - 1)[:, None, None],
                                   axis=1)[:, 0]
        return jnp.argmax(last, axis=-1).astype(jnp.int32), cache

    def decode(state: Any, cache: jax.Array, token: jax.Array,
               pos: jax.Array) -> Tuple[jax.Array, jax.Array]:
        """One step for a batch: `token` [B] at positions `pos` [B]."""
        logits, cache = forward(state, token[:, None], pos, cache)
        return jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32), cache

    def grow(cache: jax.Array, block: jax.Array) -> jax.Array:
        """The cache copied into one `block.shape[0]` positions longer."""
        pad = [(0, 0)] * cache.ndim
        pad[3] = (0, block.shape[0])
        return jnp.pad(cache, pad)

    def slot_prefill(state: Any, cache: jax.Array, tokens: jax.Array,
                     length: jax.Array, slot: jax.Array
                     ) -> Tuple[jax.Array, jax.Array]:
        """slots: prefills the padded prompt [1, P] into slot `slot`."""
        mine = jax.lax.dynamic_slice_in_dim(cache, slot[0], 1, axis=2)
        logits, mine = forward(state, tokens, jnp.zeros((1,), jnp.int32),
                               mine)
        cache = jax.lax.dynamic_update_slice_in_dim(cache, mine, slot[0],
                                                    axis=2)
        last = jnp.take_along_axis(logits, (length - 1)[:, None, None],
                                   axis=1)[:, 0]
        return jnp.argmax(last, axis=-1).astype(jnp.int32), cache

    def full(state: Any, tokens: jax.Array) -> jax.Array:
        """The model's own causal forward, no cache: greedy tokens."""
        model = nnx.merge(graphdef, state)
        return jnp.argmax(model(tokens), axis=-1).astype(jnp.int32)

    return {"init": jax.jit(init), "empty": jax.jit(empty,
                                                    static_argnums=(0, 1)),
            "prefill": jax.jit(prefill),
            "decode": jax.jit(decode, donate_argnums=(1,)),
            "grow": jax.jit(grow),
            "slot_prefill": jax.jit(slot_prefill, donate_argnums=(1,)),
            "full": jax.jit(full)}


# -- the engine --------------------------------------------------------------


def serve(args: argparse.Namespace) -> Dict[str, Any]:
    import _lm
    import jax
    import numpy as np
    from _data import corpus

    # The model at the preset's size, its positions --max-len; unrolled
    # blocks, no remat (there is no backward pass).
    margs = argparse.Namespace(
        preset=args.preset, dtype=args.dtype, attention="xla", remat="none",
        scan_layers=False, seq_buckets=None, seq_len=args.max_len,
        trace=args.trace)
    cfg = _lm.model_config(margs)
    rec = None
    if args.trace:
        import jaxlake
        name = args.trace_name or "-".join(
            ["serve", args.preset, args.cache])
        meta = {"example": "serve_lm.py", "preset": args.preset,
                "params": cfg.params(), "dtype": cfg.dtype, "cache":
                args.cache, "slots": args.slots, "requests": args.requests,
                "max_len": args.max_len, "cache_block": args.cache_block,
                "prompt_len": list(args.prompt_len), "new_tokens":
                list(args.new_tokens), "arrival_every": args.arrival_every,
                "seed": args.seed}
        try:
            rec = jaxlake.Recorder(args.trace, name,
                                   compile_only=args.compile_only, meta=meta)
        except (OSError, jaxlake.JaxlakeError) as e:
            raise SystemExit(f"error: --trace {args.trace}: {e}") from None
    _lm.start_backends()

    fns = build(cfg)
    kinds = {"init": "param", "empty": "activation",
             "prefill": ("output", "activation"),
             "decode": ("output", "activation"), "grow": "activation",
             "slot_prefill": ("output", "activation")}
    if rec is not None:
        for name, kind in kinds.items():
            fns[name] = rec.wrap(fns[name], name, kind)
    run_mode = not args.compile_only

    state = fns["init"](jax.random.key(args.seed))
    requests = make_requests(args, corpus("source"))
    block = args.cache_block
    grow_by = np.zeros((block,), np.int8)  # its shape is the growth
    waiting = list(requests)
    active: List[Request] = []
    done: List[Request] = []
    free_slots = list(range(args.slots))
    cache = None
    if args.cache == "slots":
        # The positions of idle slots; their tokens are ignored.
        cache = fns["empty"](args.slots, args.max_len)
        slot_tokens = np.zeros((args.slots,), np.int32)
        slot_pos = np.zeros((args.slots,), np.int32)
    counts = {"prefills": 0, "decodes": 0, "grows": 0, "launches": 0}
    log = open(args.log_json, "a") if args.log_json else None
    t0 = time.perf_counter()
    step = 0

    def padded(r: Request) -> Any:
        plen = len(r.prompt)
        width = -(-plen // block) * block
        tokens = np.zeros((1, width), np.int32)
        tokens[0, :plen] = r.prompt
        return tokens, np.array([plen], np.int32)

    def host(token: Any) -> int:
        return int(np.asarray(token)[0]) if run_mode else 0

    def finish(r: Request) -> None:
        r.finished = step
        if args.cache == "grow" and run_mode:
            r.generated = [host(t) for t in r.tokens]
        r.tokens = []  # the kept token buffers go with the request
        r.cache = None
        if r.slot >= 0:
            free_slots.append(r.slot)
            free_slots.sort()
        done.append(r)
        if log is not None:
            log.write(json.dumps({
                "request": r.index, "arrival": r.arrival, "started":
                r.started, "finished": r.finished, "prompt": len(r.prompt),
                "new_tokens": r.new_tokens, "tokens": r.generated}) + "\n")

    try:
        while waiting or active:
            # Join: arrived requests, while there is room.
            while waiting and waiting[0].arrival <= step and \
                    len(active) < args.slots:
                r = waiting.pop(0)
                r.started = step
                tokens, length = padded(r)
                if args.cache == "grow":
                    first, r.cache = fns["prefill"](state, tokens, length)
                    r.tokens.append(first)
                    del first
                else:
                    r.slot = free_slots.pop(0)
                    first, cache = fns["slot_prefill"](
                        state, cache, tokens, length,
                        np.array([r.slot], np.int32))
                    slot_tokens[r.slot] = host(first)
                    r.generated.append(int(slot_tokens[r.slot]))
                    del first
                r.count = 1
                counts["prefills"] += 1
                active.append(r)
            if not active:
                step = waiting[0].arrival  # idle until the next arrival
                continue
            # Leave: a request whose first token was its only one.
            for r in [r for r in active if r.count >= r.new_tokens]:
                active.remove(r)
                finish(r)
            # One decode step for every active request.
            if args.cache == "grow":
                for r in active:
                    pos = len(r.prompt) + r.count - 1
                    if pos >= r.cache.shape[3]:
                        r.cache = fns["grow"](r.cache, grow_by)
                        counts["grows"] += 1
                    token, r.cache = fns["decode"](
                        state, r.cache, r.tokens[-1],
                        np.array([pos], np.int32))
                    r.tokens.append(token)
                    del token
                    r.count += 1
                    counts["decodes"] += 1
            elif active:
                for r in active:
                    slot_pos[r.slot] = len(r.prompt) + r.count - 1
                out, cache = fns["decode"](state, cache, slot_tokens.copy(),
                                           slot_pos.copy())
                values = np.asarray(out) if run_mode else slot_tokens.copy()
                del out
                for r in active:
                    slot_tokens[r.slot] = values[r.slot]
                    r.generated.append(int(values[r.slot]))
                    r.count += 1
                counts["decodes"] += 1
            step += 1
            for r in [r for r in active if r.count >= r.new_tokens]:
                active.remove(r)
                finish(r)
            if not args.no_progress and step % 16 == 0:
                print(f"step {step}: {len(done)}/{len(requests)} done, "
                      f"{len(active)} active", file=sys.stderr, flush=True)
    finally:
        if log is not None:
            log.close()
    elapsed = time.perf_counter() - t0
    counts["launches"] = counts["prefills"] + counts["decodes"] + \
        counts["grows"]
    summary: Dict[str, Any] = {"requests": len(done), "steps": step,
                               "seconds": elapsed, **counts}
    if rec is not None:
        summary["trace"] = rec.summary()
        rec.close()
    if args.verify:
        summary["mismatches"] = verify(fns["full"], state, done)
    return summary


def verify(full: Any, state: Any, done: List[Request]) -> int:
    """Requests whose tokens differ from the uncached model's greedy ones."""
    import jax
    import numpy as np
    bad = 0
    for r in done:
        seq = np.concatenate([r.prompt, np.array(r.generated[:-1], np.int32)])
        out = np.asarray(full(state, jax.device_put(seq[None, :])))
        want = out[0, len(r.prompt) - 1:]
        if list(want) != list(r.generated):
            bad += 1
            print(f"request {r.index}: cached {r.generated} but uncached "
                  f"{[int(t) for t in want]}", file=sys.stderr)
    return bad


def main(argv: Optional[List[str]] = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    check_args(p, args)
    status = _common.start(args.jaxlake, args.jaxlake_option)
    summary = serve(args)
    print(f"served {summary['requests']} requests in {summary['steps']} "
          f"decode steps: {summary['prefills']} prefills, "
          f"{summary['decodes']} decode launches, {summary['grows']} cache "
          f"growths, {summary['seconds']:.1f}s")
    if "trace" in summary:
        print(summary["trace"])
    _common.finish(status, args.log_json)
    if summary.get("mismatches"):
        print(f"error: --verify: {summary['mismatches']} of "
              f"{summary['requests']} requests differ from the uncached "
              "model", file=sys.stderr)
        return 1
    if args.verify:
        print(f"verified: all {summary['requests']} requests match the "
              "uncached model")
    return 0


if __name__ == "__main__":
    sys.exit(main())
