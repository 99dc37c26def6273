"""What the multi-LoRA gateway costs, on loopback, against direct access and against sglang-router.

    python benchmarks/bench_router.py [--scale 1.0] [--engine-delay-ms 0] [--rounds 3] [--prompt-tokens 64]

Starts, each in its own process: one fake SGLang engine (real ``/generate`` protocol, scripted reply),
``aclarena serve-router`` in front of it (tag from the ``X-Aclarena-Env`` header, four experts), and
``sglang-router`` from PyPI in front of the same engine (``lora_path`` in the body, round robin). Then
sends the same ``/generate`` request at 1, 16 and 64 concurrent clients to each, in interleaved rounds
(``--rounds``), and prints the medians of latency p50/p99, throughput, the throughput ratio to direct
access in the same round, and each proxy's CPU time per request (steadier than throughput on a shared
machine). Also prints the tag classifier's accuracy on
held-out prompts of the four envs. Numbers depend on the machine's load: the table prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
TAGS = ("math", "search", "retail", "ifeval")
LEVELS = ((1, 200), (16, 800), (64, 1600))  # (concurrent clients, requests) at --scale 1

# Written by hand for this benchmark, in none of the generators' templates: a less flattering test.
FREEFORM = {
    "math": [
        "Let ABC be a triangle with AB = 13, BC = 14, CA = 15. Find the inradius.",
        "How many subsets of {1, 2, ..., 10} contain no two consecutive integers?",
        "Determine all real x with sqrt(x + 3) = x - 3.",
        "The polynomial p has integer coefficients and p(1) = 5, p(2) = 7. What is p(3) mod 2?",
        "Evaluate the sum of 1/(k(k+1)) for k from 1 to 99.",
        "Find the last two digits of 3^400.",
        "A bag holds 4 red and 6 blue marbles; two are drawn. What is the chance both are red?",
        "What is the greatest common divisor of 2002 and 1547?",
    ],
    "search": [
        "Who composed the music for the opera Carmen?",
        "In what year did the Berlin Wall fall?",
        "Which element has the chemical symbol W?",
        "Who is the author of One Hundred Years of Solitude?",
        "What is the longest river in South America?",
        "Which band released the album Rumours?",
        "Who was the first woman to win a Nobel Prize?",
        "What language is mainly spoken in Brazil?",
    ],
    "retail": [
        "hey, my package says delivered but I never got it",
        "I'd like a refund for the sneakers, they don't fit",
        "can you swap the blue jacket in my last purchase for size M?",
        "I need to update my default shipping address",
        "Why hasn't my order shipped yet? I paid three days ago.",
        "Please remove the phone case from my pending purchase.",
        "I forgot which email I used for my account, my zip is 94110.",
        "Is it possible to pay the rest with my PayPal instead?",
    ],
    "ifeval": [
        "Describe your morning routine in exactly three sentences.",
        "List five fruits, each on its own line, without using the letter e.",
        "Give me a limerick about a cat; put the whole thing in capital letters.",
        "Explain photosynthesis to a child using no more than 40 words.",
        "Compose a tweet about coffee that ends with the word 'cheers'.",
        "Write two paragraphs on sleep; separate them with a markdown divider.",
        "Draft a thank-you note and include the keywords 'grateful' and 'garden'.",
        "Summarize the plot of Cinderella in JSON format.",
    ],
}


def serve_engine(workdir: Path, delay_ms: float) -> None:
    """Child process: a fake engine on a free loopback port; prints its URL, serves until killed."""
    from transformers import AutoTokenizer

    from aclarena_slime.local.tiny_model import save_tiny_checkpoint
    from aclarena_slime.testing.fake_sglang import FakeSGLang

    tokenizer = AutoTokenizer.from_pretrained(save_tiny_checkpoint(workdir / "tok"))

    class SlowFake(FakeSGLang):
        async def _generate(self, request):  # type: ignore[no-untyped-def]
            if delay_ms:
                await asyncio.sleep(delay_ms / 1000)  # stands in for generation time
            response = await super()._generate(request)
            self.requests.clear()  # a benchmark keeps no history
            return response

    async def main() -> None:
        async with SlowFake(tokenizer, ["The answer is \\boxed{4}."]) as engine:
            print(f"engine listening on {engine.url}", flush=True)
            await asyncio.Event().wait()

    asyncio.run(main())


def cpu_seconds(pid: int) -> float:
    """CPU time of a process, all threads, in ns-precise scheduler accounting (Linux); nan elsewhere.

    On a shared machine throughput swings with the neighbours' load; CPU per request barely does.
    """
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        return sum(int(Path(f"/proc/{pid}/task/{t}/schedstat").read_text().split()[0]) for t in tasks) / 1e9
    except (OSError, ValueError, IndexError):
        return float("nan")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(cmd: list[str], marker: str, timeout_s: float = 120.0) -> tuple[subprocess.Popen, str]:
    """Start a child and wait for the stdout line that starts with ``marker``; returns it (marker removed)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{cmd[0]} exited before it was ready (status {proc.wait()})")
        if line.startswith(marker):
            return proc, line[len(marker) :].strip()
    proc.kill()
    raise RuntimeError(f"{' '.join(cmd)} was not ready within {timeout_s:g}s")


def start_sglang_router(engine_url: str) -> tuple[subprocess.Popen | None, str]:
    """sglang-router in front of the engine, or (None, reason) when it cannot run here."""
    exe = shutil.which("sglang-router") or str(Path(sys.executable).with_name("sglang-router"))
    if not Path(exe).exists():
        return None, "sglang-router is not installed (pip install sglang-router)"
    port = _free_port()
    cmd = [exe, "launch", "--worker-urls", engine_url, "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--policy", "round_robin", "--log-level", "error", "--disable-retries", "--disable-circuit-breaker"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    return proc, f"http://127.0.0.1:{port}"


async def wait_serving(url: str, payload: dict, headers: dict, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.post(f"{url}/generate", json=payload, headers=headers) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not answer /generate within {timeout_s:g}s")
            await asyncio.sleep(0.2)


async def load(url: str, payload: dict, headers: dict, clients: int, requests: int) -> dict[str, float]:
    """``requests`` requests over ``clients`` concurrent connections; latency in ms, throughput in req/s."""
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", **headers}
    latencies: list[float] = []
    remaining = iter(range(requests))
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def client() -> None:
            for _ in remaining:
                t0 = time.perf_counter()
                async with session.post(f"{url}/generate", data=body, headers=headers) as resp:
                    await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"{url} answered {resp.status}")
                latencies.append((time.perf_counter() - t0) * 1000)

        await asyncio.gather(*(client() for _ in range(min(clients, 4))))  # warm-up connections
        latencies.clear()
        remaining = iter(range(requests))
        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        wall = time.perf_counter() - start
    q = statistics.quantiles(latencies, n=100)
    return {"p50": statistics.median(latencies), "p99": q[98], "rps": len(latencies) / wall}


def classifier_accuracy() -> tuple[dict[str, tuple[float, float]], float, int]:
    from aclarena_slime.router.classifier import TagClassifier
    from aclarena_slime.router.tag_prompts import labelled_prompts

    train = labelled_prompts(TAGS, 300, seed=0)
    held_out = labelled_prompts(TAGS, 200, seed=1, exclude={text for text, _ in train})  # never a training prompt
    t0 = time.perf_counter()
    model = TagClassifier.train([t for t, _ in train], [g for _, g in train])
    seconds = time.perf_counter() - t0
    per_tag = {}
    for tag in TAGS:
        texts = [t for t, g in held_out if g == tag]
        per_tag[tag] = (
            model.accuracy(texts, [tag] * len(texts)),
            model.accuracy(FREEFORM[tag], [tag] * len(FREEFORM[tag])),
        )
    freeform = [(t, tag) for tag, texts in FREEFORM.items() for t in texts]
    per_tag["all"] = (
        model.accuracy([t for t, _ in held_out], [g for _, g in held_out]),
        model.accuracy([t for t, _ in freeform], [g for _, g in freeform]),
    )
    return per_tag, seconds, len(held_out)


def print_table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(f"\n{title}\n" + " | ".join(columns))
        for row in rows:
            print(" | ".join(row))
        return
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="right" if col not in {"target", "env"} else "left")
    for row in rows:
        table.add_row(*row)
    Console(width=max(120, shutil.get_terminal_size().columns)).print(table)


async def bench(args: argparse.Namespace, workdir: Path) -> None:
    children: list[subprocess.Popen] = []
    try:
        engine, engine_url = _spawn(
            [sys.executable, __file__, "--serve-engine", str(workdir), "--engine-delay-ms", str(args.engine_delay_ms)],
            "engine listening on ",
        )
        children.append(engine)
        manifest = workdir / "experts.json"
        experts = {}
        for tag in TAGS:
            (workdir / "experts" / tag).mkdir(parents=True, exist_ok=True)
            experts[tag] = {"adapter": f"{tag}-expert", "path": f"experts/{tag}"}
        manifest.write_text(json.dumps({"version": 1, "base": {"name": "bench"}, "experts": experts}))
        gateway, gateway_url = _spawn(
            [
                sys.executable,
                "-m",
                "aclarena_slime",
                "serve-router",
                "--engine",
                engine_url,
                "--experts",
                str(manifest),
                "--port",
                "0",
            ],
            "aclarena router listening on ",
        )
        children.append(gateway)
        router, router_url = start_sglang_router(engine_url)
        if router is not None:
            children.append(router)

        payload = {
            "input_ids": [100 + i % 400 for i in range(args.prompt_tokens)],
            "sampling_params": {"max_new_tokens": 16},
            "return_logprob": True,
        }
        with_lora = {**payload, "lora_path": "math-expert"}
        targets = [
            ("direct", engine_url, with_lora, {}),
            ("aclarena serve-router", gateway_url, payload, {"X-Aclarena-Env": "math"}),
        ]
        proxies = {"aclarena serve-router": gateway.pid}
        router_note = ""
        if router is not None:
            try:
                await wait_serving(router_url, with_lora, {})
                targets.append(("sglang-router", router_url, with_lora, {}))
                proxies["sglang-router"] = router.pid
            except RuntimeError as exc:
                router_note = f"sglang-router not measured: {exc}"
        else:
            router_note = f"sglang-router not measured: {router_url}"
        for _, url, body, headers in targets:
            await wait_serving(url, body, headers)

        # Rounds, the targets' order rotated in each: a neighbour's load burst hits all of them alike.
        runs: dict[tuple[str, int], list[dict[str, float]]] = {}
        cpu: dict[tuple[str, int], list[float]] = {}
        for round_ in range(args.rounds):
            for clients, n in LEVELS:
                requests = max(clients * 4, int(n * args.scale))
                shift = round_ % len(targets)
                for name, url, body, headers in targets[shift:] + targets[:shift]:
                    before = cpu_seconds(proxies[name]) if name in proxies else 0.0
                    runs.setdefault((name, clients), []).append(await load(url, body, headers, clients, requests))
                    after = cpu_seconds(proxies[name]) if name in proxies else 0.0
                    cpu.setdefault((name, clients), []).append((after - before) / requests * 1e6)
        rows = []
        for clients, _ in LEVELS:
            base = runs["direct", clients]
            for name, *_ in targets:
                r = runs[name, clients]
                p50, rps = statistics.median(x["p50"] for x in r), statistics.median(x["rps"] for x in r)
                ratios = [x["rps"] / d["rps"] for x, d in zip(r, base, strict=True)]  # each against direct in the same round
                spread = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
                rows.append(
                    [
                        name,
                        str(clients),
                        f"{p50:.2f}",
                        f"{statistics.median(x['p99'] for x in r):.2f}",
                        f"{rps:.0f}",
                        "-" if name == "direct" else f"{p50 / statistics.median(x['p50'] for x in base):.2f}x",
                        "-" if name == "direct" else f"{statistics.median(ratios):.2f}{spread}",
                        "-" if name == "direct" else f"{statistics.median(cpu[name, clients]):.0f}",
                    ]
                )
        load_avg = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        title = (
            f"/generate of {args.prompt_tokens} token ids on loopback, fake engine (+{args.engine_delay_ms:g} ms), "
            f"{os.cpu_count()} CPUs, "
            f"load average {load_avg:.1f}; medians of {args.rounds} interleaved rounds"
        )
        cols = ["target", "clients", "p50 ms", "p99 ms", "req/s", "p50 ratio", "throughput ratio (min-max)"]
        cols.append("proxy CPU us/req")
        print_table(title, cols, rows)
        if router_note:
            print(router_note)
    finally:
        for proc in children:
            proc.terminate()
        for proc in children:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the number of requests per level")
    parser.add_argument("--engine-delay-ms", type=float, default=0.0, help="simulated generation time per request")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the table gives medians")
    parser.add_argument("--prompt-tokens", type=int, default=64, help="token ids in each request's prompt")
    parser.add_argument("--skip-classifier", action="store_true")
    parser.add_argument("--serve-engine", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_engine:
        serve_engine(Path(args.serve_engine), args.engine_delay_ms)
        return
    with tempfile.TemporaryDirectory(prefix="bench-router-") as tmp:
        asyncio.run(bench(args, Path(tmp)))
    if not args.skip_classifier:
        per_tag, seconds, n = classifier_accuracy()
        rows = [[tag, f"{held * 100:.1f}%", f"{free * 100:.1f}%"] for tag, (held, free) in per_tag.items()]
        title = f"tag classifier (trained in {seconds:.1f} s): accuracy on {n} held-out generated and 32 hand-written prompts"
        print_table(title, ["env", "held-out generated", "hand-written"], rows)


if __name__ == "__main__":
    main()
