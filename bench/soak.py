"""Soak: steady mixed traffic with admin churn for minutes or hours; memory, descriptors, errors, events.

Two gateway processes, identical but for their prediction-log sink (one writes the local file, one
produces to the test Kafka broker), each with a contract of two H2O releases sharing traffic by
phase-in and a NeverValid shadow, all logging FULL. A steady stream of single-row requests (BASIC
/score, V2 REST, V2 gRPC, GraphPipe, in turn) goes to both, and every ``--admin-every`` seconds
each gateway takes an admin change (policy and logging updates, contract settings, and a release
deployed then deleted: the model load/unload path). At the end it prints, per gateway: RSS at
start, after warm-up and at the end with its slope after warm-up, open file descriptors, answers
by status, admin answers by status, and the prediction log's events produced / delivered / dropped
against what the sink really holds (lines of the file; end offsets of the Kafka topics).

    python bench/soak.py                    # 10 minutes (about 11 with start-up)
    python bench/soak.py --minutes 60       # the long run
    python bench/soak.py --minutes 0.5      # a quick check of the harness
    python bench/soak.py --rollout          # deploys under traffic on one gateway, --workers 2 and
                                            # two Redis replicas (bench/rollout.py): 0 failures

Targets for the long run: RSS growth after warm-up under 50 MB, no unexpected answer (anything but
a success), no event lost (delivered == held by the sink, nothing dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import payloads  # noqa: E402
from bench.servers import free_port, wait_http  # noqa: E402

CONTRACT = ("soak", "prostate", 1)
BASE = "/soak/prostate/1"
MODEL = "soak.prostate.1"
KINDS = ("score", "v2", "grpc", "gp")
TOPIC, GP_TOPIC = "soak.predictions", "soak.predictions.gp"


# ---- gateways ------------------------------------------------------------------------------------
@dataclass
class Gateway:
    """One gateway child process and what the soak measured on it."""

    name: str
    proc: subprocess.Popen[bytes]
    url: str
    grpc_port: int
    data_dir: Path
    samples: list[tuple[float, float, int]] = field(default_factory=list)  # (seconds, RSS MiB, open fds)
    answers: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, status) -> count
    admin: Counter[str] = field(default_factory=Counter)
    ok_requests: int = 0

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def sample(self, t: float) -> None:
        self.samples.append((t, self.rss_mb(), self.fds()))


def start_gateway(name: str, work: Path, env: dict[str, str]) -> Gateway:
    port, grpc_port = free_port(), free_port()
    data_dir = work / f"data-{name}"
    full_env = {
        **os.environ,
        "FORESTFLOW_GRPC_PORT": str(grpc_port),
        "FORESTFLOW_ACCESS_LOG": "0",
        "FORESTFLOW_LOG_LEVEL": "warning",
        **env,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "forestflow.cli", "serve", "--port", str(port), "--data-dir", str(data_dir)],
        env=full_env,
        cwd=ROOT,
        stdout=open(work / f"{name}.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    gw = Gateway(name, proc, f"http://127.0.0.1:{port}", grpc_port, data_dir)
    wait_http(gw.url + "/health/live")
    return gw


def release(name: str, *, validity: str = "ImmediatelyValid", phase_in_s: int = 0, log_level: str = "FULL") -> dict[str, Any]:
    body = payloads.definition(CONTRACT, log_level)
    body["fqrv"]["release_version"] = name
    policy = body["servableSettings"]["policySettings"]
    policy["validityPolicy"] = [{validity: {}}]
    if phase_in_s:
        policy["phaseInPolicy"] = {"LinearTimeBasedPhaseIn": {"phase_in_over_secs": phase_in_s}}
    return body


def set_up(gw: Gateway, phase_in_s: int) -> None:
    contract = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 5}}, "router": {"FairPhaseInPctBasedRouter": {}}}
    first = release("a")
    first["contractSettings"] = contract
    for body in (first, release("b", phase_in_s=phase_in_s), release("shadow", validity="NeverValid")):
        r = requests.post(gw.url + "/servable", json=body, timeout=300)
        r.raise_for_status()


# ---- traffic -------------------------------------------------------------------------------------
def grpc_request(i: int) -> bytes:
    from forestflow._proto.grpc_predict_v2 import messages

    m = messages()
    row = payloads.rows(i + 1)[-1]
    req = m["ModelInferRequest"](model_name=MODEL, id=f"g{i}")
    req.parameters["reqid"].string_param = f"g{i}"
    for c in payloads.CATEGORICAL:
        t = req.inputs.add(name=c, datatype="BYTES", shape=[1])
        t.contents.bytes_contents.append(row[c].encode())
    for c in payloads.NUMERIC:
        t = req.inputs.add(name=c, datatype="FP64", shape=[1])
        t.contents.fp64_contents.append(float(row[c]))
    return req.SerializeToString()


class Traffic:
    """Single-row requests of every kind, prepared once (the key varies through configs)."""

    def __init__(self) -> None:
        self.score = payloads.score_body(1)
        self.v2 = payloads.v2_body(1)
        self.gp = payloads.graphpipe_body(1)
        self.grpc = grpc_request(0)
        if self.gp is None:
            raise SystemExit("the graphpipe client is needed (pip install --no-deps graphpipe==1.0.4)")

    async def one(self, gw: Gateway, kind: str, session: aiohttp.ClientSession, channel: grpc.aio.Channel) -> str:
        """Send one request; return its status as a string ("200", "503", "gp-error", "grpc-UNAVAILABLE", ...)."""
        if kind == "grpc":
            call = channel.unary_unary(
                "/inference.GRPCInferenceService/ModelInfer", request_serializer=None, response_deserializer=None
            )
            try:
                await call(self.grpc, timeout=30)
                return "200"
            except grpc.aio.AioRpcError as exc:
                return f"grpc-{exc.code().name}"
        path, body, ctype = {
            "score": (f"{BASE}/score", self.score, "application/json"),
            "v2": (f"/v2/models/{MODEL}/infer", self.v2, "application/json"),
            "gp": (f"{BASE}/gp", self.gp, "application/octet-stream"),
        }[kind]
        async with session.post(gw.url + path, data=body, headers={"Content-Type": ctype}) as r:
            payload = await r.read()
            if r.status == 200 and kind == "gp" and _gp_failed(payload):
                return "gp-error"
            return str(r.status)


def _gp_failed(payload: bytes) -> bool:
    from graphpipe import convert

    try:
        _, errors = convert.deserialize_infer_response(payload)
    except Exception:
        return True
    return bool(errors)


async def drive(gateways: list[Gateway], traffic: Traffic, rate: float, seconds: float, concurrency: int) -> Counter[str]:
    """Requests at a steady ``rate`` (per second, all gateways together) for ``seconds``."""
    client: Counter[str] = Counter()
    slots = asyncio.Semaphore(concurrency)
    tasks: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        channels = {gw.name: grpc.aio.insecure_channel(f"127.0.0.1:{gw.grpc_port}") for gw in gateways}
        try:
            start = time.monotonic()
            plan = itertools.cycle(list(itertools.product(KINDS, gateways)))
            for i in itertools.count():
                due = start + i / rate
                if due - start >= seconds:
                    break
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                kind, gw = next(plan)
                if slots.locked():
                    client["skipped (client at its concurrency limit)"] += 1
                    continue

                async def send(gw: Gateway = gw, kind: str = kind) -> None:
                    async with slots:
                        try:
                            status = await traffic.one(gw, kind, session, channels[gw.name])
                        except (TimeoutError, aiohttp.ClientError) as exc:
                            status = f"client-{type(exc).__name__}"
                    gw.answers[(kind, status)] += 1
                    if status == "200":
                        gw.ok_requests += 1

                task = asyncio.create_task(send())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.gather(*tasks)
        finally:
            for channel in channels.values():
                await channel.close()
    return client


async def admin_churn(gateways: list[Gateway], every_s: float, stop: asyncio.Event, phase_in_s: int) -> None:
    """An admin change on every gateway every ``every_s`` seconds, cycling through what admins do."""
    contract = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 5}}, "router": {"FairPhaseInPctBasedRouter": {}}}
    policy = {
        "validityPolicy": [{"ImmediatelyValid": {}}],
        "phaseInPolicy": {"LinearTimeBasedPhaseIn": {"phase_in_over_secs": phase_in_s}},
    }
    step = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), every_s)
                return
            except TimeoutError:
                pass
            action = step % 5
            extra = f"extra-{step // 5}"
            for gw in gateways:
                if action == 0:
                    request = session.put(f"{gw.url}{BASE}/b/policy", json=policy)
                elif action == 1:
                    level = "SAMPLE" if (step // 5) % 2 == 0 else "FULL"
                    request = session.put(f"{gw.url}{BASE}/shadow/logging", json={"logLevel": level, "keyFeatures": ["reqid"]})
                elif action == 2:
                    request = session.put(f"{gw.url}{BASE}", json=contract)
                elif action == 3:
                    request = session.post(f"{gw.url}/servable", json=release(extra, validity="NeverValid", log_level="NONE"))
                else:
                    request = session.delete(f"{gw.url}{BASE}/{extra}")
                try:
                    async with request as r:
                        await r.read()
                        gw.admin[f"{('policy', 'logging', 'contract', 'deploy', 'delete')[action]} {r.status}"] += 1
                except (TimeoutError, aiohttp.ClientError) as exc:
                    gw.admin[f"client-{type(exc).__name__}"] += 1
            step += 1


async def sampler(gateways: list[Gateway], every_s: float, stop: asyncio.Event, t0: float) -> None:
    while not stop.is_set():
        for gw in gateways:
            gw.sample(time.monotonic() - t0)
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except TimeoutError:
            pass


async def soak(gateways: list[Gateway], args: argparse.Namespace, phase_in_s: int) -> Counter[str]:
    stop = asyncio.Event()
    t0 = time.monotonic()
    background = [
        asyncio.create_task(sampler(gateways, args.sample_every, stop, t0)),
        asyncio.create_task(admin_churn(gateways, args.admin_every, stop, phase_in_s)),
    ]
    try:
        return await drive(gateways, Traffic(), args.rate, args.minutes * 60, args.concurrency)
    finally:
        stop.set()
        await asyncio.gather(*background)
        for gw in gateways:
            gw.sample(time.monotonic() - t0)


# ---- the sinks -----------------------------------------------------------------------------------
def wait_drained(gw: Gateway, timeout_s: float = 120) -> dict[str, Any]:
    """The prediction log's counters once nothing is buffered (or the deadline passes)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = requests.get(gw.url + "/metrics/json", timeout=30).json()
        log = stats["predictionLog"]
        if log["bufferedEvents"] == 0 or time.monotonic() > deadline:
            return stats


def file_events(gw: Gateway) -> tuple[int, int]:
    """``(events in the file log, served events among them)``."""
    events = served = 0
    for name in ("predictions.jsonl", "predictions.gp.jsonl"):
        path = gw.data_dir / name
        if not path.exists():
            continue
        with open(path, "rb") as fh:
            for line in fh:
                events += 1
                served += b'"servedRequest":true' in line
    return events, served


def kafka_events(bootstrap: str) -> tuple[int, int]:
    """``(records read back from the two topics, sum of their end offsets)``."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def count() -> tuple[int, int]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest"
        )
        await consumer.start()
        try:
            await consumer.topics()
            tps = [TopicPartition(t, p) for t in (TOPIC, GP_TOPIC) for p in (consumer.partitions_for_topic(t) or ())]
            if not tps:
                return 0, 0
            ends = await consumer.end_offsets(tps)
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            read = 0
            idle_since = time.monotonic()
            while time.monotonic() - idle_since < 10:
                batches = await consumer.getmany(timeout_ms=1000, max_records=10000)
                got = sum(len(records) for records in batches.values())
                read += got
                if got:
                    idle_since = time.monotonic()
                positions = [await consumer.position(tp) for tp in tps]
                if all(pos >= ends[tp] for pos, tp in zip(positions, tps)):
                    break
            return read, sum(ends.values())
        finally:
            await consumer.stop()

    return asyncio.run(count())


# ---- report --------------------------------------------------------------------------------------
def slope_mb_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of RSS over time, in MiB per hour."""
    if len(points) < 2:
        return float("nan")
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mr = sum(r for _, r in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (r - mr) for t, r in points) / var * 3600 if var else float("nan")


def report(gw: Gateway, args: argparse.Namespace, stats: dict[str, Any], at_sink: int, served_at_sink: int | None) -> bool:
    warm = args.warmup_minutes * 60
    after = [(t, r) for t, r, _ in gw.samples if t >= warm] or [(t, r) for t, r, _ in gw.samples[-2:]]
    start_rss, end_rss = gw.samples[0][1], gw.samples[-1][1]
    warm_rss = after[0][1]
    growth = end_rss - warm_rss
    log = stats["predictionLog"]
    unexpected = sum(n for (_, status), n in gw.answers.items() if status != "200")
    admin_failed = sum(n for key, n in gw.admin.items() if not key.endswith(" 200"))
    lost = log["delivered"] - at_sink
    print(f"== gateway '{gw.name}' (prediction log: {log['sink']})")
    print(
        f"   RSS MiB: start {start_rss:.0f}, after warm-up ({args.warmup_minutes:g} min) {warm_rss:.0f}, end {end_rss:.0f}; "
        f"growth after warm-up {growth:+.1f} MiB; slope after warm-up {slope_mb_per_hour(after):+.1f} MiB/h "
        f"({len(after)} samples)"
    )
    print(f"   open fds: start {gw.samples[0][2]}, max {max(f for _, _, f in gw.samples)}, end {gw.samples[-1][2]}")
    by_kind: dict[str, Counter[str]] = {}
    for (kind, status), n in sorted(gw.answers.items()):
        by_kind.setdefault(kind, Counter())[status] += n
    print("   answers: " + "; ".join(f"{kind} {dict(c)}" for kind, c in by_kind.items()))
    print(f"   admin: {dict(sorted(gw.admin.items()))}")
    print(
        f"   events: produced {log['produced']}, delivered {log['delivered']}, dropped {log['dropped']} "
        f"(overflow {log['droppedOverflow']}), buffered {log['bufferedEvents']}, send failures {log['sendFailures']}; "
        f"held by the sink {at_sink}"
        + (f" ({served_at_sink} served, {gw.ok_requests} successful requests)" if served_at_sink is not None else "")
    )
    shadow_dropped = sum(s["shadowDropped"] for s in stats["schedulers"].values())
    print(f"   shadow copies dropped by full shadow queues (not scored, so no event): {shadow_dropped}")
    checks = {
        "RSS growth after warm-up < 50 MiB": growth < 50,
        "0 unexpected answers": unexpected == 0,
        "0 failed admin calls": admin_failed == 0,
        "0 events lost (delivered == held by the sink, 0 dropped)": lost == 0 and log["dropped"] == 0,
    }
    if served_at_sink is not None:
        checks["one served event per successful request"] = served_at_sink == gw.ok_requests
    for what, ok in checks.items():
        print(f"   [{'ok' if ok else 'FAIL'}] {what}")
    return all(checks.values())


def main() -> int:
    if "--rollout" in sys.argv[1:]:  # the rollout loop on every deployment shape (bench/rollout.py)
        from bench import rollout

        return rollout.main([a for a in sys.argv[1:] if a != "--rollout"])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the traffic phase (default %(default)s)")
    parser.add_argument(
        "--rate", type=float, default=60.0, help="requests per second, both gateways together (default %(default)s)"
    )
    parser.add_argument("--concurrency", type=int, default=64, help="most requests in flight (default %(default)s)")
    parser.add_argument("--admin-every", type=float, default=3.0, help="seconds between admin changes (default %(default)s)")
    parser.add_argument("--sample-every", type=float, default=10.0, help="seconds between RSS/fd samples (default %(default)s)")
    parser.add_argument(
        "--warmup-minutes",
        type=float,
        default=None,
        help="RSS growth is measured from here (default: a fifth of the run, at most 5)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, data dirs)")
    args = parser.parse_args()
    if args.warmup_minutes is None:
        args.warmup_minutes = min(5.0, args.minutes / 5)
    args.sample_every = min(args.sample_every, max(1.0, args.minutes * 60 / 20))
    phase_in_s = max(60, int(args.minutes * 60 * 2))  # release b is still phasing in at the end

    from tests.kafka_broker import running_broker

    work = Path(tempfile.mkdtemp(prefix="forestflow-soak-"))
    print(
        f"# soak: {args.minutes:g} min at {args.rate:g} req/s ({', '.join(KINDS)} in turn, two gateways), "
        f"admin change every {args.admin_every:g} s; work dir {work}",
        flush=True,
    )
    ok = False
    with running_broker() as broker:
        kafka_env = {
            "FORESTFLOW_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
            "FORESTFLOW_KAFKA_ENABLE_IDEMPOTENCE": "false",
            "FORESTFLOW_KAFKA_TOPIC": TOPIC,
            "FORESTFLOW_KAFKA_GP_TOPIC": GP_TOPIC,
        }
        gateways = [start_gateway("file", work, {}), start_gateway("kafka", work, kafka_env)]
        try:
            for gw in gateways:
                set_up(gw, phase_in_s)
            started = time.monotonic()
            client = asyncio.run(soak(gateways, args, phase_in_s))
            print(f"# traffic phase: {time.monotonic() - started:.0f} s; client side: {dict(client) or 'nothing skipped'}")
            stats = [wait_drained(gw) for gw in gateways]
            file_total, file_served = file_events(gateways[0])
            ok = report(gateways[0], args, stats[0], file_total, file_served)
            read_back, end_offsets = kafka_events(broker.bootstrap)
            print(f"# kafka topics: {read_back} records read back, end offsets sum to {end_offsets}")
            ok = report(gateways[1], args, stats[1], read_back, None) and ok
        finally:
            for gw in gateways:
                gw.proc.terminate()
                try:
                    gw.proc.wait(60)
                except subprocess.TimeoutExpired:
                    gw.proc.kill()
    print(
        f"# soak {'passed' if ok else 'FAILED'}; logs in {work}"
        if args.keep or not ok
        else f"# soak {'passed' if ok else 'FAILED'}"
    )
    if not args.keep and ok:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
