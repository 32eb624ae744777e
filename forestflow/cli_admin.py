"""The ``forestflow`` commands that talk to a running gateway: deploy, list, watch, phase in, shadow, undeploy,
score, explain, read settings and metadata.

Each prints for people (aligned tables, durations, percentages) or, with ``--json``, the server's JSON for
scripts. Exit codes: 0 done, 1 refused (the server's message on stderr), 2 the gateway cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from forestflow.cli_format import count, duration, parse_duration, percent, table

DEFAULT_URL = "http://127.0.0.1:8090"
URL_HELP = "gateway URL; host:port means http://host:port (default: %(default)s)"


class Refused(Exception):
    """The gateway answered with an error status (or the command refused before asking)."""

    def __init__(self, message: str, status: int = 0, body: Any = None) -> None:
        super().__init__(message)
        self.status, self.body = status, body


class Unreachable(Exception):
    """No answer from the gateway."""


def gateway_url(text: str) -> str:
    """A gateway URL as the user typed it: ``localhost:8090`` and ``:8090`` (httpie's style) mean http."""
    text = text.strip()
    if text.startswith(":"):
        text = "127.0.0.1" + text
    if "://" not in text:
        text = "http://" + text
    return text.rstrip("/")


class Client:
    """JSON calls to one gateway; an error status raises :class:`Refused`, no answer :class:`Unreachable`."""

    def __init__(self, url: str, token: str | None = None) -> None:
        self.url, self.token = gateway_url(url), token

    def call(self, method: str, path: str, body: Any = None, timeout: float = 600) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            payload = exc.read()
            try:
                answer = json.loads(payload)
            except ValueError:
                answer = {"error": payload.decode(errors="replace").strip() or exc.reason}
            message = answer.get("error") if isinstance(answer, dict) else None
            code = answer.get("code") if isinstance(answer, dict) else None
            raise Refused(f"{exc.code}{' ' + code if code else ''}: {message or exc.reason}", exc.code, answer) from None
        except (OSError, ValueError) as exc:  # URLError, refused, reset, timeout; a body that is not JSON
            reason = getattr(exc, "reason", exc)
            raise Unreachable(f"cannot reach {self.url}: {reason}") from None


def _fail(message: str) -> None:
    print(f"forestflow: {message}", file=sys.stderr)


def run(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A command with the exit codes: 0 done, 1 refused, 2 unreachable."""

    def wrapped(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except Refused as exc:
            if getattr(args, "json", False) and exc.body is not None:
                print(json.dumps(exc.body, indent=2))
            _fail(f"refused: {exc}")
            return 1
        except Unreachable as exc:
            _fail(str(exc))
            return 2

    return wrapped


def _client(args: argparse.Namespace) -> Client:
    return Client(args.url, getattr(args, "token", None))


def _emit(args: argparse.Namespace, answer: Any, human: Callable[[], str]) -> int:
    print(json.dumps(answer, indent=2) if args.json else human())
    return 0


# ---- addresses ----------------------------------------------------------------------------------
def _parts(text: str, n: int, what: str, example: str) -> list[str]:
    parts = text.strip("/").split("/") if "/" in text else text.split(".")
    if len(parts) != n or not all(parts) or not parts[2].isdigit():
        raise Refused(f"{text!r} is not a {what} (e.g. {example})")
    return parts


def contract_path(text: str) -> str:
    """``org/project/N`` (or ``org.project.N``) -> ``/org/project/N``."""
    return "/" + "/".join(_parts(text, 3, "contract", "samples/prostate/1"))


def release_path(text: str) -> str:
    """``org/project/N/release`` -> ``/org/project/N/release``."""
    if "/" not in text:
        raise Refused(f"{text!r} is not a release (e.g. samples/prostate/1/gbm-v2)")
    return "/" + "/".join(_parts(text, 4, "release", "samples/prostate/1/gbm-v2"))


def _name(fqrv: dict[str, Any]) -> str:
    return str(fqrv.get("releaseVersion") or fqrv.get("release_version"))


# ---- settings, shown ------------------------------------------------------------------------------
def _validity(policy: dict[str, Any]) -> str:
    rules = []
    for rule in policy.get("validityPolicy", []):
        (name, params), *_ = rule.items()
        shown = ", ".join(f"{k}={v}" for k, v in params.items())
        rules.append(f"{name}({shown})" if shown else name)
    return " + ".join(rules) or "-"


def _phase_in(policy: dict[str, Any]) -> str:
    (name, params), *_ = (policy.get("phaseInPolicy") or {"-": {}}).items()
    if name == "LinearTimeBasedPhaseIn":
        return f"linear over {duration(int(params.get('phaseInOverSecs', params.get('phase_in_over_secs', 0))))}"
    return "immediate" if name == "ImmediatePhaseIn" else name


def _logging(settings: dict[str, Any]) -> str:
    logging = settings.get("loggingSettings", {})
    keys = ",".join(logging.get("keyFeatures", []))
    return str(logging.get("logLevel", "NONE")) + (f" by {keys}" if keys else "")


def _ago(ms: Any) -> str:
    return "-" if ms in (None, "0") else duration(max(0.0, time.time() - int(ms) / 1000)) + " ago"


# ---- commands -----------------------------------------------------------------------------------
def cmd_deploy(args: argparse.Namespace) -> int:
    """POST a servable definition; with ``--wait``, show what the gateway is doing until it answers."""
    try:
        definition = json.loads(Path(args.file).read_bytes())
    except OSError as exc:
        raise Refused(f"cannot read {args.file}: {exc.strerror or exc}") from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise Refused(
            f"{args.file} is not JSON ({exc}); expected a servable definition such as servables/prostate-gbm.json"
        ) from None
    if isinstance(definition, dict) and isinstance(definition.get("path"), str):
        definition["path"] = _absolute_file_path(definition["path"])
    client = _client(args)
    started = time.monotonic()
    if not args.wait:
        answer = client.call("POST", "/servable", definition)
    else:
        answer = _deploy_showing_progress(client, definition, started)
    fqrv = answer["ServableCreatedSuccessfully"]["fqrv"]
    contract = fqrv["contract"]
    where = f"{contract['organization']}/{contract['project']}/{contract['contractNumber']}/{_name(fqrv)}"
    return _emit(args, answer, lambda: f"deployed {where} in {duration(time.monotonic() - started)}")


def _deploy_showing_progress(client: Client, definition: Any, started: float) -> Any:
    """The deploy call in a thread; meanwhile the gateway's /health/ready says what each load is doing."""
    outcome: dict[str, Any] = {}

    def deploy() -> None:
        try:
            outcome["answer"] = client.call("POST", "/servable", definition)
        except (Refused, Unreachable) as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=deploy, daemon=True)
    worker.start()
    tty = sys.stderr.isatty()
    shown = ""
    while worker.is_alive():
        worker.join(0.25)
        if not worker.is_alive():
            break
        try:
            phases = client.call("GET", "/health/ready", timeout=5).get("loadingPhases") or {}
        except Refused as exc:  # 503 while loading: the body still says what loads
            phases = (exc.body or {}).get("loadingPhases") or {} if isinstance(exc.body, dict) else {}
        except Unreachable:
            phases = {}
        state = "deploying: " + (", ".join(f"{name} {phase}" for name, phase in sorted(phases.items())) or "waiting")
        line = f"{state} ({duration(time.monotonic() - started)})"
        if tty:
            print(f"\r\x1b[K{line}", end="", file=sys.stderr, flush=True)
        elif state != shown:
            print(line, file=sys.stderr, flush=True)
        shown = state
    if tty and shown:
        print("\r\x1b[K", end="", file=sys.stderr, flush=True)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["answer"]


def _absolute_file_path(path: str) -> str:
    """``file://./dir`` or ``file://dir`` relative to where the command runs -> an absolute file URI."""
    parsed = urlparse(path)
    if parsed.scheme != "file":
        return path
    local = parsed.netloc + parsed.path
    if os.path.isabs(local):
        return path
    return Path(local).resolve().as_uri()


def cmd_contracts(args: argparse.Namespace) -> int:
    """The contracts of the gateway."""
    answer = _client(args).call("GET", "/contracts/list")
    rows = [(c["organization"], c["project"], c["contractNumber"]) for c in answer["Contracts"]["contracts"]]
    return _emit(args, answer, lambda: table(["ORGANIZATION", "PROJECT", "N"], rows) if rows else "no contracts")


def cmd_releases(args: argparse.Namespace) -> int:
    """A contract's releases: validity, phase-in and logging."""
    client, path = _client(args), contract_path(args.contract)
    metrics = {_name(m["ServableMetrics"]["fqrv"]): m["ServableMetrics"] for m in client.call("GET", path + "/stats")}
    settings = {
        _name(s["ServableSettings"]["fqrv"]): s["ServableSettings"] for s in client.call("GET", path + "/servable-settings")
    }
    oldest_first = sorted(metrics, key=lambda r: int(metrics[r]["createdAtMS"]))
    releases = [{"release": r, "metrics": metrics[r], "settings": settings.get(r, {})} for r in oldest_first]
    rows = []
    for item in releases:
        m, policy = item["metrics"], item["settings"].get("policySettings", {})
        rows.append(
            (
                item["release"],
                percent(m["currentPhaseInPct"] / 100),
                _validity(policy),
                _phase_in(policy),
                _logging(item["settings"]),
                "-" if "NeverValid" in _validity(policy) else _ago(m.get("becameValidAtMS")),
                _ago(m.get("createdAtMS")),
            )
        )
    headers = ["RELEASE", "PHASE-IN", "VALIDITY", "PHASE-IN POLICY", "LOGGING", "VALID SINCE", "DEPLOYED"]
    return _emit(args, releases, lambda: table(headers, rows))


def _stats_rows(stats: list[dict[str, Any]], before: dict[str, tuple[float, int]], now: float) -> list[tuple[Any, ...]]:
    rows = []
    for item in sorted(stats, key=lambda item: int(item["ServableMetrics"]["createdAtMS"])):  # oldest first
        m = item["ServableMetrics"]
        release, scores = _name(m["fqrv"]), int(m["scoreCount"])
        perf = m.get("performanceMetrics", {})
        p99 = perf.get("p99LatencyMs")
        seen = before.get(release)
        rate = f"{(scores - seen[1]) / (now - seen[0]):.1f}/s" if seen and now > seen[0] else "-"
        before[release] = (now, scores)
        rows.append(
            (
                release,
                percent(m["currentPhaseInPct"] / 100),
                count(scores),
                rate,
                count(m["shadeCount"]),
                count(m["errorCount"]),
                count(m["shadeErrorCount"]),
                percent(perf.get("errorRate")),
                percent(perf.get("agreement")),
                "-" if p99 is None else f"{p99:.1f} ms",
            )
        )
    return rows


STATS_HEADERS = ["RELEASE", "PHASE-IN", "SCORES", "RATE", "SHADOWS", "ERRORS", "SHADOW ERRORS", "ERROR RATE", "AGREEMENT", "P99"]


def cmd_stats(args: argparse.Namespace) -> int:
    """Counters per release; ``--watch`` refreshes them in place."""
    client, path = _client(args), contract_path(args.contract)
    before: dict[str, tuple[float, int]] = {}
    refreshes = 0
    tty = sys.stdout.isatty()
    try:
        while True:
            stats = client.call("GET", path + "/stats")
            rows = _stats_rows(stats, before, time.monotonic())
            refreshes += 1
            if args.json:
                print(json.dumps(stats) if args.watch else json.dumps(stats, indent=2), flush=True)
            else:
                view = table(STATS_HEADERS, rows)
                if args.watch:
                    stamp = time.strftime("%H:%M:%S")
                    view = f"{args.contract} at {client.url}, {stamp}, every {args.interval:g}s (Ctrl-C stops)\n\n{view}"
                    print("\x1b[H\x1b[2J" + view if tty else view + "\n", flush=True)
                else:
                    print(view)
            if not args.watch or (args.count and refreshes >= args.count):
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


def _settings_of(client: Client, release: str) -> dict[str, Any]:
    answer = client.call("GET", release_path(release) + "/settings")
    return dict(answer["ServableSettings"])


def cmd_phase_in(args: argparse.Namespace) -> int:
    """Make a release valid (its gates kept, NeverValid dropped) and phase it in over ``--over``."""
    try:
        over = parse_duration(args.over)
    except ValueError as exc:
        raise Refused(f"--over: {exc}") from None
    client = _client(args)
    policy = _settings_of(client, args.release).get("policySettings", {})
    rules = [rule for rule in policy.get("validityPolicy", []) if "NeverValid" not in rule] or [{"ImmediatelyValid": {}}]
    phase_in = {"LinearTimeBasedPhaseIn": {"phase_in_over_secs": over}} if over else {"ImmediatePhaseIn": {}}
    new_policy = {"validityPolicy": rules, "phaseInPolicy": phase_in}
    answer = client.call("PUT", release_path(args.release) + "/policy-settings", new_policy)
    how = f"over {duration(over)}" if over else "at once"
    return _emit(args, answer, lambda: f"{args.release} phases in {how} once valid ({_validity(new_policy)})")


def cmd_shadow(args: argparse.Namespace) -> int:
    """Take a release out of routing (NeverValid): it scores shadow copies of every request and answers none."""
    client = _client(args)
    settings = _settings_of(client, args.release)
    logging = settings.get("loggingSettings", {})
    if logging.get("logLevel", "NONE") == "NONE":
        if not args.key:
            raise Refused(
                f"{args.release} logs nothing (logLevel NONE), so it would get no shadow copies: "
                "give --key <configs name> to log it FULL, keyed by that request config"
            )
        client.call("PUT", release_path(args.release) + "/logging-settings", {"logLevel": "FULL", "keyFeatures": [args.key]})
    policy = settings.get("policySettings", {})
    rules = [r for r in policy.get("validityPolicy", []) if "NeverValid" not in r and "ImmediatelyValid" not in r]
    new_policy = {
        "validityPolicy": [{"NeverValid": {}}, *rules],
        "phaseInPolicy": policy.get("phaseInPolicy", {"ImmediatePhaseIn": {}}),
    }
    answer = client.call("PUT", release_path(args.release) + "/policy-settings", new_policy)
    return _emit(args, answer, lambda: f"{args.release} shadows: it scores a copy of every request and answers none")


def cmd_undeploy(args: argparse.Namespace) -> int:
    """Remove a release (its contract goes with its last one)."""
    answer = _client(args).call("DELETE", release_path(args.release))
    return _emit(args, answer, lambda: f"undeployed {args.release}")


def cmd_settings(args: argparse.Namespace) -> int:
    """A contract's router and expiration and each release's policies, or one release's settings."""
    client = _client(args)
    if args.target.count("/") == 3 or args.target.count(".") == 3:
        if args.keep or args.router:
            raise Refused("--keep and --router are a contract's settings: give org/project/N")
        settings = _settings_of(client, args.target)
        policy = settings.get("policySettings", {})
        lines = [
            ("validity", _validity(policy)),
            ("phase-in", _phase_in(policy)),
            ("logging", _logging(settings)),
            ("strict inputs", "yes" if settings.get("strictInputs") else "no"),
        ]
        return _emit(args, {"ServableSettings": settings}, lambda: "\n".join(f"{k + ':':<15}{v}" for k, v in lines))
    path = contract_path(args.target)
    if args.keep or args.router:
        _change_contract(client, path, args)
    contract = client.call("GET", path + "/contract-settings")["ContractSettings"]
    releases = client.call("GET", path + "/servable-settings")
    (router, *_), (expiration, params) = contract.get("router", {"-": {}}), next(iter(contract["expirationPolicy"].items()))
    rows = [
        (
            _name(s["ServableSettings"]["fqrv"]),
            _validity(p := s["ServableSettings"].get("policySettings", {})),
            _phase_in(p),
            _logging(s["ServableSettings"]),
        )
        for s in releases
    ]

    def human() -> str:
        shown = ", ".join(f"{k}={v}" for k, v in params.items())
        head = f"router:     {router}\nexpiration: {expiration}({shown})\n\n"
        return head + table(["RELEASE", "VALIDITY", "PHASE-IN POLICY", "LOGGING"], rows)

    return _emit(args, {"ContractSettings": contract, "ServableSettings": releases}, human)


ROUTERS = {"fair": "FairPhaseInPctBasedRouter", "latest": "LatestPhaseInPctBasedRouter"}


def _change_contract(client: Client, path: str, args: argparse.Namespace) -> None:
    """PUT the contract's settings with ``--keep`` / ``--router`` changed (the rest as they are)."""
    current = client.call("GET", path + "/contract-settings")["ContractSettings"]
    if args.keep:
        current["expirationPolicy"] = {"KeepLatest": {"servablesToKeep": args.keep}}
    if args.router:
        current["router"] = {ROUTERS[args.router]: {}}
    client.call("PUT", path, current)


def cmd_metadata(args: argparse.Namespace) -> int:
    """A release's (or every release of a contract's) inputs and outputs."""
    one = args.target.count("/") == 3 or args.target.count(".") == 3
    path = release_path(args.target) if one else contract_path(args.target)
    answer = _client(args).call("GET", path + "/metadata")
    metas = [answer["BasicMetaData"]] if one else [m["BasicMetaData"] for m in answer]

    def human() -> str:
        blocks = []
        for meta in metas:
            rows = [
                (io, t["name"], t["type"], "[" + ", ".join(t["shape"]) + "]", t.get("description", ""))
                for io in ("input", "output")
                for t in meta[io + "s"]
            ]
            block = f"{_name(meta['fqrv'])}: {meta['description']}\n" + table(["", "NAME", "TYPE", "SHAPE", "DESCRIPTION"], rows)
            if "backend" in meta:
                b = meta["backend"]
                block += f"\nbackend: {b.get('url')} model {b.get('model')} ({b.get('protocol')}), {b.get('state')}"
            blocks.append(block)
        return "\n\n".join(blocks)

    return _emit(args, answer, human)


def _read_body(file: str) -> dict[str, Any]:
    try:
        body = json.loads(Path(file).read_bytes())
    except OSError as exc:
        raise Refused(f"cannot read {file}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise Refused(f"{file} is not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise Refused(f"{file}: expected a /score body (schema, datum) or a V2 inference request (inputs)")
    return body


def _basic_rows(prediction: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    headers = [field for column in prediction.get("schema", []) for field in column.get("fields", [])]
    rows = []
    for record in prediction.get("datum", []):
        row: list[Any] = []
        for tensor in record.get("tensors", []):
            (_, values), *_ = tensor.items()
            row += values.get("data", [])
        rows.append(row)
    return headers, rows


def _v2_rows(outputs: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    headers: list[str] = []
    columns: list[list[Any]] = []
    for output in outputs:
        shape, data = output.get("shape", [len(output.get("data", []))]), output.get("data", [])
        width = 1
        for dim in shape[1:]:
            width *= int(dim)
        n = int(shape[0]) if shape else 1
        for j in range(width):
            headers.append(output["name"] if width == 1 else f"{output['name']}.{j}")
            columns.append([data[i * width + j] for i in range(n)] if len(data) == n * width else ["?"] * n)
    return headers, [list(row) for row in zip(*columns)] if columns else []


def _shown(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def cmd_score(args: argparse.Namespace) -> int:
    """Score a BASIC (/score) or V2 body file; print the answer as a table."""
    body = _read_body(args.file)
    client = _client(args)
    parts = contract_path(args.contract).strip("/").split("/")
    if "inputs" in body:
        version = f"/versions/{args.release}" if args.release else ""
        answer = client.call("POST", f"/v2/models/{'.'.join(parts)}{version}/infer", body)
        headers, rows = _v2_rows(answer.get("outputs", []))
        who = str(answer.get("model_version"))
    else:
        if args.release:
            raise Refused("--release needs a V2 body (a /score body is routed by the contract's policies)")
        answer = client.call("POST", "/" + "/".join(parts) + "/score", body)
        prediction = answer["Prediction"]
        headers, rows = _basic_rows(prediction)
        who = _name(prediction["fqrv"])

    def human() -> str:
        lines = [f"answered by {who}", table(headers, [[_shown(v) for v in row] for row in rows])]
        for key in ("missingInputs", "unknownInputs"):
            if answer.get("Prediction", {}).get(key):
                lines.append(f"{key}: {', '.join(answer['Prediction'][key])}")
        return "\n".join(lines)

    return _emit(args, answer, human)


def cmd_explain(args: argparse.Namespace) -> int:
    """POST a /score body to the contract's /explain route and print what it answers."""
    body = _read_body(args.file)
    path = contract_path(args.contract)
    try:
        answer = _client(args).call("POST", path + "/explain", body)
    except Refused as exc:
        code = exc.body.get("code") if isinstance(exc.body, dict) else None
        if exc.status in (404, 405) and code not in ("UnknownContract", "UnknownServable"):
            raise Refused(
                f"the gateway at {gateway_url(args.url)} has no POST {path}/explain route ({exc.status}): it explains nothing"
            ) from None
        raise
    return _emit(args, answer, lambda: json.dumps(answer, indent=2))


# ---- parser ---------------------------------------------------------------------------------------
def add_commands(sub: Any) -> None:
    """Register the commands that talk to a running gateway."""
    token_default = os.environ.get("FORESTFLOW_ADMIN_TOKEN")

    def command(name: str, func: Callable[[argparse.Namespace], int], help_text: str, admin: bool = False) -> Any:
        parser = sub.add_parser(name, help=help_text, description=help_text)
        parser.add_argument("--url", default=DEFAULT_URL, help=URL_HELP)
        parser.add_argument("--json", action="store_true", help="print the server's JSON (for scripts)")
        if admin:
            parser.add_argument("--token", default=token_default, help="admin token (default $FORESTFLOW_ADMIN_TOKEN)")
        parser.set_defaults(func=run(func))
        return parser

    deploy = command(
        "deploy",
        cmd_deploy,
        "deploy a servable definition JSON file (ForestFlow's BasicServeRequest); a relative file:// path in it "
        "is resolved from the current directory",
        admin=True,
    )
    deploy.add_argument("file", help="the servable definition, e.g. servables/prostate-gbm.json")
    deploy.add_argument("--wait", action="store_true", help="show what the gateway does (fetching, loading) until it answers")
    command("contracts", cmd_contracts, "list the contracts")
    command("releases", cmd_releases, "a contract's releases: phase-in, validity, logging").add_argument(
        "contract", help="org/project/N"
    )
    stats = command("stats", cmd_stats, "scores, shadow copies, errors, phase-in and agreement per release")
    stats.add_argument("contract", help="org/project/N")
    stats.add_argument("--watch", action="store_true", help="refresh in place until Ctrl-C")
    stats.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default %(default)s)")
    stats.add_argument("--count", type=int, default=0, help="with --watch: stop after this many refreshes")
    phase_in = command("phase-in", cmd_phase_in, "make a release valid and phase it in", admin=True)
    phase_in.add_argument("release", help="org/project/N/release")
    phase_in.add_argument("--over", default="0", help="linear phase-in over this long (90s, 10m, 1h; default: at once)")
    shadow = command("shadow", cmd_shadow, "take a release out of routing: it scores shadow copies only", admin=True)
    shadow.add_argument("release", help="org/project/N/release")
    shadow.add_argument("--key", help="when the release logs nothing: log it FULL, keyed by this request config")
    command("undeploy", cmd_undeploy, "remove a release", admin=True).add_argument("release", help="org/project/N/release")
    settings = command(
        "settings",
        cmd_settings,
        "a contract's router, expiration and release policies, or one release's; --keep and --router change them",
    )
    settings.add_argument("target", help="org/project/N or org/project/N/release")
    settings.add_argument("--keep", type=int, help="keep the N most recently valid releases (KeepLatest), expire older ones")
    settings.add_argument(
        "--router", choices=sorted(ROUTERS), help="fair: every valid release by its phase-in; latest: the newest"
    )
    settings.add_argument("--token", default=token_default, help="admin token, to change (default $FORESTFLOW_ADMIN_TOKEN)")
    command("metadata", cmd_metadata, "inputs and outputs of a release (or of every release of a contract)").add_argument(
        "target", help="org/project/N/release or org/project/N"
    )
    score = command("score", cmd_score, "score a /score body or a V2 inference request from a file")
    score.add_argument("file", help="the body, e.g. servables/prostate-score.json")
    score.add_argument("--contract", required=True, help="org/project/N")
    score.add_argument("--release", help="with a V2 body: score this release only")
    explain = command("explain", cmd_explain, "explain the predictions of a /score body (the gateway's /explain route)")
    explain.add_argument("file", help="the body, e.g. servables/prostate-score.json")
    explain.add_argument("--contract", required=True, help="org/project/N")
