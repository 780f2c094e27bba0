"""Garbage in, one line out: every command of ``evoharness``, every option type, fed bad
values, answers with one line on stderr naming the option, exits 2 (1 where the work itself
failed, as documented), and never prints a traceback.

The app is built the way the console script builds it and run in-process through its entry
point (``main(argv) -> exit code``). Three sweeps:

- every numeric option and argument of every command gets a non-number, and a negative
  number where it has a lower bound (and each has one, or is listed as signed);
- every option and argument that names a file gets what users pass by mistake: a path that
  does not exist, a folder, a binary file, a text file that is not a database, run against a
  small real home (a trace store of offline shop runs, an evolve state, a memory store, a
  registry with two prompt versions);
- ``--env`` gets plugins that are broken in each way a plugin can be, and each enum-like
  string option an empty string.
"""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.models import ArgumentInfo, OptionInfo

from evoharness.evolve import cli as evolve_cli
from evoharness.evolve.cli import main

SIGNED = {("prompt-evolve propose", "seed"), ("prompt-evolve evaluate", "seed")}
"""Numeric parameters where a negative value means something (a random seed)."""


def _leaves(app: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Callable[..., Any]]]:
    for info in app.registered_commands:
        yield " ".join([*path, info.name or info.callback.__name__]), info.callback
    for group in app.registered_groups:
        yield from _leaves(group.typer_instance, (*path, group.name))


class Param(typing.NamedTuple):
    command: str
    name: str
    flag: str | None
    """``--flag``; ``None`` for an argument."""
    base: type
    info: Any
    """The parameter's typer OptionInfo or ArgumentInfo."""
    required: bool


def _parameters() -> Iterator[Param]:
    """Every parameter of every command of the app the console script builds."""
    for command, fn in _leaves(evolve_cli.build_app()):
        for name, param in inspect.signature(fn, eval_str=True).parameters.items():
            base, info = param.annotation, None
            if typing.get_origin(base) is typing.Annotated:
                base, *meta = typing.get_args(base)
                info = next((m for m in meta if isinstance(m, OptionInfo | ArgumentInfo)), None)
            types = [t for t in typing.get_args(base) if t is not type(None)] or [base]
            base = types[0]
            if typing.get_origin(base) is list:
                base = typing.get_args(base)[0]
            required = param.default is inspect.Parameter.empty
            if isinstance(info, OptionInfo) or (info is None and not required):
                decls = [*(info.param_decls or ()), info.default] if info is not None else []
                flags = [d for d in decls if isinstance(d, str) and d.startswith("--")]
                flag = flags[0] if flags else "--" + name.replace("_", "-")
                yield Param(command, name, flag, base, info, required)
            else:
                yield Param(command, name, None, base, info, required)


@pytest.fixture(autouse=True)
def _elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A command that takes a bad value by mistake writes its default stores
    (``.evoharness/...``) under ``tmp_path``, never into the working tree."""
    monkeypatch.chdir(tmp_path)


PARAMS = list(_parameters())
NUMERIC = [p for p in PARAMS if p.base in (int, float)]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(
    code: int, out: str, err: str, *, needle: tuple[str, ...], codes: tuple[int, ...] = (2,)
) -> None:
    """The command refused in one line on stderr naming one of ``needle``, no traceback."""
    assert "Traceback" not in out + err, err[-2000:]
    lines = err.strip().splitlines()
    assert code in codes, (code, err, out[-500:])
    assert len(lines) == 1 and lines[0].startswith("evoharness: error: "), err
    assert any(n in lines[0] for n in needle), (needle, lines[0])


# -- numbers ------------------------------------------------------------------------------------
def _argv(command: str, name: str, value: str) -> list[str]:
    """``command`` with ``value`` for parameter ``name`` and a valid value for every other
    required one (arguments after ``--``, so that a negative number stays a value)."""
    here = [p for p in PARAMS if p.command == command]
    options: list[str] = []
    arguments: list[str] = []
    for p in here:
        if p.name == name:
            (arguments if p.flag is None else options).append(
                value if p.flag is None else f"{p.flag}={value}"
            )
        elif p.required:
            valid = "1" if p.base in (int, float) else __file__ if p.base is Path else "x"
            (arguments if p.flag is None else options).append(
                valid if p.flag is None else f"{p.flag}={valid}"
            )
    return [*command.split(), *options, "--", *arguments]


def _names(p: Param) -> tuple[str, ...]:
    """How click names the parameter in its messages."""
    return (p.flag,) if p.flag else (f"'{p.name.upper()}'", f"'{p.name}'")


def test_every_numeric_parameter_has_a_lower_bound_or_is_signed() -> None:
    unbounded = [
        (p.command, p.name)
        for p in NUMERIC
        if (p.info is None or p.info.min is None) and (p.command, p.name) not in SIGNED
    ]
    assert not unbounded, unbounded
    assert len(NUMERIC) >= 60  # the sweep below covers them all


def _id(p: Param) -> str:
    return f"{p.command} {p.flag or p.name.upper()}"


@pytest.mark.parametrize("value", ["abc", "nan", "inf", "-inf"])
@pytest.mark.parametrize("p", NUMERIC, ids=_id)
def test_a_value_that_is_not_a_finite_number_is_refused_in_one_line(
    p: Param, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(_argv(p.command, p.name, value), capsys)
    _one_line(code, out, err, needle=_names(p))


BOUNDED = [p for p in NUMERIC if p.info is not None and p.info.min is not None]


@pytest.mark.parametrize("below", [-1, -5])
@pytest.mark.parametrize("p", BOUNDED, ids=_id)
def test_a_number_below_the_bound_is_refused_in_one_line(
    p: Param, below: int, capsys: pytest.CaptureFixture[str]
) -> None:
    value = below if p.info.min > below else math.floor(p.info.min) + below
    code, out, err = _run(_argv(p.command, p.name, str(value)), capsys)
    _one_line(code, out, err, needle=_names(p))


# -- files --------------------------------------------------------------------------------------
class Home(typing.NamedTuple):
    """A small real home: stores with data in them, and files users pass by mistake."""

    files: dict[str, Path]
    trace_id: str


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Home:
    from evoharness.harness.tracing import TraceStore

    root = tmp_path_factory.mktemp("home")
    f = {
        name: root / name
        for name in ("traces.db", "evolve.db", "memory.db", "registry.db", "results.db")
    }
    f = {k.split(".")[0]: v for k, v in f.items()}
    for n, text in (
        ("v1", "You help people shop."),
        ("v2", "You help. Check stock first."),
        ("v3", "You help. Be brief."),
    ):
        f[n] = root / f"{n}.txt"
        f[n].write_text(text)
    f["layers"] = root / "layers.json"
    f["layers"].write_text('{"rows": [{"layer": "baseline", "split": "val", "success_rate": 0.5}]}')
    f["missing"] = root / "no-such-folder" / "none.db"
    f["folder"] = root / "a-folder"
    f["folder"].mkdir()
    f["empty-folder"] = root / "an-empty-folder"
    f["empty-folder"].mkdir()
    f["binary"] = root / "random.bin"
    f["binary"].write_bytes(bytes(range(256)) * 40)
    f["text"] = root / "notes.txt"
    f["text"].write_text("hello, this is not a database\n")
    f["empty"] = root / "empty.txt"
    f["empty"].write_text("")
    f["not-json"] = root / "broken.json"
    f["not-json"].write_text('{"rows": [')
    f["wrong-shape"] = root / "wrong.json"
    f["wrong-shape"].write_text('{"rows": [{"layer": 3, "success_rate": "high"}]}')
    r = ["--registry", str(f["registry"])]
    steps = [
        [
            "run",
            "--limit",
            "3",
            "--faults",
            "none",
            "--db",
            str(f["traces"]),
            "--out",
            str(root / "runs.jsonl"),
        ],
        [
            "evolve",
            "cycle",
            "--db",
            str(f["traces"]),
            "--state",
            str(f["evolve"]),
            "--memory-path",
            str(f["memory"]),
            "--env",
            "shop",
            *r,
        ],
        ["prompts", "create", "shop", "-f", str(f["v1"]), "--activate", *r],
        ["prompts", "create", "shop", "-f", str(f["v2"]), *r],
    ]
    for argv in steps:
        assert main(argv) == 0, argv
    store = TraceStore(f["traces"])
    trace_id = store.traces()[0].id
    store.close()
    return Home(f, trace_id)


READ_STORE = ("missing", "folder", "binary", "text")
"""A store a command reads: it must exist and be one."""
STORE = ("folder", "binary", "text")
"""A store a command opens, creating it where none is."""
OUT_FILE = ("folder",)
IN_TEXT = ("missing", "folder", "binary", "empty")
IN_JSON = ("missing", "folder", "binary", "not-json", "wrong-shape")
MANIFESTS = ("missing", "text", "empty-folder")
OUT_DIR = ("binary",)

# valid, quick invocations ({name} is a file of the home; {new} a fresh path)
BASE: dict[str, list[str]] = {
    "run": ["run", "--limit", "1", "--faults", "none", "--db", "{new}.db", "--out", "{new}.jsonl"],
    "traces list": ["traces", "list", "--db", "{traces}"],
    "traces show": ["traces", "show", "{trace}", "--db", "{traces}"],
    "traces stats": ["traces", "stats", "--db", "{traces}"],
    "traces backup": ["traces", "backup", "{new}.db", "--db", "{traces}"],
    "traces export": ["traces", "export", "--db", "{traces}", "--timeout", "1"],
    "prompts list": ["prompts", "list", "--registry", "{registry}"],
    "prompts show": ["prompts", "show", "shop", "--registry", "{registry}"],
    "prompts diff": ["prompts", "diff", "shop", "1", "2", "--registry", "{registry}"],
    "prompts create": ["prompts", "create", "shop", "-f", "{v3}", "--registry", "{registry}"],
    "prompts rollout": ["prompts", "rollout", "shop", "2", "--registry", "{registry}"],
    "prompts promote": ["prompts", "promote", "shop", "2", "--registry", "{registry}"],
    "prompts rollback": ["prompts", "rollback", "shop", "--registry", "{registry}"],
    "prompts status": ["prompts", "status", "shop", "--db", "{traces}", "--registry", "{registry}"],
    "registry list": ["registry", "list", "prompt", "--registry", "{registry}"],
    "registry versions": ["registry", "versions", "prompt", "shop", "--registry", "{registry}"],
    "registry show": ["registry", "show", "prompt", "shop", "--registry", "{registry}"],
    "registry diff": ["registry", "diff", "prompt", "shop", "1", "2", "--registry", "{registry}"],
    "registry promote": ["registry", "promote", "prompt", "shop", "2", "--registry", "{registry}"],
    "registry rollback": ["registry", "rollback", "prompt", "shop", "--registry", "{registry}"],
    "registry events": ["registry", "events", "--registry", "{registry}"],
    "evolve judge": [
        "evolve",
        "judge",
        "--db",
        "{traces}",
        "--state",
        "{evolve}",
        "--env",
        "shop",
        "--registry",
        "{registry}",
    ],
    "evolve route": ["evolve", "route", "--db", "{traces}", "--state", "{evolve}"],
    "evolve memory": ["evolve", "memory", "list", "--path", "{memory}", "--registry", "{registry}"],
    "evolve guard": ["evolve", "guard", "show", "--registry", "{registry}"],
    "evolve cycle": [
        "evolve",
        "cycle",
        "--db",
        "{traces}",
        "--state",
        "{evolve}",
        "--env",
        "shop",
        "--memory-path",
        "{memory}",
        "--registry",
        "{registry}",
    ],
    "evolve replay": [
        *("evolve", "replay", "--state", "{evolve}", "--registry", "{registry}", "--env", "shop"),
        *("--replay-db", "{new}.db", "--model", "m", "--base-url", "http://127.0.0.1:9/v1"),
    ],
    "monitor": ["monitor", "--db", "{traces}", "--registry", "{registry}"],
    "report": [
        "report",
        "--db",
        "{traces}",
        "--registry",
        "{registry}",
        "--out",
        "{new}.html",
        "--layers",
        "{layers}",
    ],
    "prompt-evolve evaluate": [
        "prompt-evolve",
        "evaluate",
        "2",
        "--registry",
        "{registry}",
        "--results",
        "{results}",
        "--db",
        "{traces}",
        "--val-limit",
        "1",
        "--guard-limit",
        "1",
        "--no-handoff",
    ],
    "prompt-evolve propose": [
        "prompt-evolve",
        "propose",
        "--registry",
        "{registry}",
        "--state",
        "{evolve}",
        "--results",
        "{results}",
        "--db",
        "{traces}",
        "--val-limit",
        "1",
        "--guard-limit",
        "1",
        "--no-evaluate",
        "--budget",
        "1",
    ],
    "demo": [
        "demo",
        "--workdir",
        "{new}",
        "--train-limit",
        "1",
        "--val-limit",
        "1",
        "--test-limit",
        "1",
    ],
    "bench weights": ["bench", "weights", "--workdir", "{new}"],
    **{
        f"weights {stage}": ["weights", stage, "--workdir", "{new}", "--registry", "{registry}"]
        for stage in ("train", "publish", "gate", "activate", "status")
    },
    "weights dataset": [
        *("weights", "dataset", "--workdir", "{new}", "--registry", "{registry}"),
        *("--db", "{traces}", "--state", "{evolve}", "--env", "shop", "--all-episodes"),
    ],
    "weights run": [
        *("weights", "run", "dataset", "--workdir", "{new}", "--registry", "{registry}"),
        *("--db", "{traces}", "--state", "{evolve}", "--env", "shop", "--all-episodes"),
    ],
    "weights rollback": ["weights", "rollback", "--registry", "{registry}"],
    "rollout start": ["rollout", "start", "prompt", "shop", "2", "--registry", "{registry}"],
    "rollout status": [
        *("rollout", "status", "prompt", "shop", "--db", "{traces}", "--registry", "{registry}"),
    ],
    "rollout promote": ["rollout", "promote", "prompt", "shop", "--registry", "{registry}"],
    "rollout rollback": ["rollout", "rollback", "prompt", "shop", "--registry", "{registry}"],
    "bench bfcl": ["bench", "bfcl", "--workdir", "{new}"],
    "bench learn": ["bench", "learn", "--env", "shop", "--model", "tiny", "--workdir", "{new}"],
}

# what each file option must refuse, by flag; (command, flag) overrides the flag's rule
ROLE: dict[str, tuple[str, ...]] = {
    "--db": READ_STORE,
    "--trace-db": STORE,
    "--registry": STORE,
    "--state": STORE,
    "--path": STORE,
    "--memory-path": STORE,
    "--results": STORE,
    "--eval-db": STORE,
    "--replay-db": STORE,
    "--file": IN_TEXT,
    "--layers": IN_JSON,
    "--datasets": MANIFESTS,
    "--out": OUT_FILE,
    "--workdir": OUT_DIR,
    "TARGET": OUT_FILE,
}
OVERRIDE: dict[tuple[str, str], tuple[str, ...]] = {
    ("run", "--db"): STORE,  # run creates its store
    ("report", "--db"): STORE,  # no store: the run sections are left out, as documented
    ("prompt-evolve propose", "--db"): STORE,  # the evaluation store beside it is created
    ("prompt-evolve evaluate", "--db"): STORE,
    ("evolve memory", "TARGET"): (),  # a file or a version: its own cases below
    ("evolve guard", "TARGET"): (),
}


def _file_cases() -> Iterator[tuple[str, str, str]]:
    for p in PARAMS:
        is_file = p.base is Path or p.flag == "--registry"
        key = p.flag or p.name.upper()
        if not is_file or p.command not in BASE:
            continue
        for bad in OVERRIDE.get((p.command, key), ROLE[key]):
            yield p.command, key, bad


FILE_CASES = list(_file_cases())


def _fill(argv: list[str], home: Home, new: Path) -> list[str]:
    names = {f"{{{k}}}": str(v) for k, v in home.files.items()}
    names["{trace}"] = home.trace_id[:12]
    out = []
    for a in argv:
        for k, v in names.items():
            a = a.replace(k, v)
        out.append(a.replace("{new}", str(new)))
    return out


def _with(argv: list[str], key: str, value: str) -> list[str]:
    """``argv`` with ``value`` for option ``key`` (or for the TARGET argument)."""
    if key == "TARGET":
        i = next(i for i, a in enumerate(argv) if a.startswith("/") and "{new}" not in a)
        return [*argv[:i], value, *argv[i + 1 :]]
    if key in argv:
        i = argv.index(key)
        return [*argv[: i + 1], value, *argv[i + 2 :]]
    if key == "--file" and "-f" in argv:
        i = argv.index("-f")
        return [*argv[: i + 1], value, *argv[i + 2 :]]
    return [*argv, key, value]


def test_every_command_with_a_file_option_is_swept() -> None:
    swept = {c for c, _, _ in FILE_CASES}
    with_files = {p.command for p in PARAMS if p.base is Path or p.flag == "--registry"}
    assert with_files - swept <= {"evolve replay", "bench skills"}, with_files - swept
    assert len(FILE_CASES) >= 100


@pytest.mark.parametrize(
    ("command", "key", "bad"), [pytest.param(*c, id=" ".join(c)) for c in FILE_CASES]
)
def test_a_bad_file_is_refused_in_one_line(
    command: str,
    key: str,
    bad: str,
    home: Home,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = _fill(BASE[command], home, tmp_path / "new")
    if key == "TARGET":  # the backup target: its argument
        argv = [*argv[:2], str(home.files[bad]), *argv[3:]]
    else:
        argv = _with(argv, key, str(home.files[bad]))
    code, out, err = _run(argv, capsys)
    names = {"TARGET": (str(home.files[bad]),), "--trace-db": ("--trace-db", "--db")}
    _one_line(code, out, err, needle=names.get(key, (key,)))


# -- plugins and strings --------------------------------------------------------------------------
PLUGINS = {
    "sweep_raises": "raise RuntimeError('the plugin needs ORDERDESK_URL')\n",
    "sweep_syntax": "def environment(:\n    pass\n",
    "sweep_needs_args": (
        "class Plugin:\n    def __init__(self, config):\n        self.config = config\n"
    ),
    "sweep_factory_raises": ("def environment():\n    raise KeyError('ORDERDESK_URL')\n"),
    "sweep_not_a_plugin": "environment = 42\n",
}
BAD_ENVS = [
    "no-such-env",
    ":",
    "sweep_raises:",
    ":environment",
    "sweep_raises:environment",
    "sweep_syntax:environment",
    "sweep_needs_args:Plugin",
    "sweep_factory_raises:environment",
    "sweep_not_a_plugin:environment",
    "sweep_not_a_plugin:nothing_here",
    "orderdesk_not_on_the_path.plugin:environment",
]
ENV_BASE = {
    **{c: BASE[c] for c in ("run", "evolve judge", "evolve cycle", "monitor")},
    "prompt-evolve evaluate": BASE["prompt-evolve evaluate"],
    "prompt-evolve propose": BASE["prompt-evolve propose"],
    "bench skills": ["bench", "skills", "--train-limit", "3", "--val-limit", "2"],
    **{c: BASE[c] for c in ("weights dataset", "weights gate", "weights run")},
}


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, source in PLUGINS.items():
        (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_every_command_with_env_is_swept() -> None:
    with_env = {p.command for p in PARAMS if p.flag == "--env"}
    # bench learn's --env names one of its two benchmarks (bfcl, shop), not a plugin: an
    # unknown one is refused in one line by the empty-string and value sweeps
    assert with_env - set(ENV_BASE) <= {"evolve replay", "bench learn"}


@pytest.mark.parametrize(
    ("command", "spec"),
    [pytest.param(c, e, id=f"{c} --env {e}") for c in ENV_BASE for e in BAD_ENVS],
)
def test_a_broken_env_plugin_is_one_line_naming_it(
    command: str,
    spec: str,
    home: Home,
    plugins: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = _with(_fill(ENV_BASE[command], home, tmp_path / "new"), "--env", spec)
    code, out, err = _run(argv, capsys)
    _one_line(code, out, err, needle=(repr(spec), f"--env {spec}"))


def test_a_broken_plugin_says_what_broke_and_how_to_fix_it(
    home: Home, plugins: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def line(spec: str) -> str:
        argv = _with(_fill(BASE["evolve cycle"], home, tmp_path / "new"), "--env", spec)
        code, out, err = _run(argv, capsys)
        _one_line(code, out, err, needle=(repr(spec),))
        return err

    assert "RuntimeError: the plugin needs ORDERDESK_URL (at " in line("sweep_raises:environment")
    assert "sweep_raises.py:1" in line("sweep_raises:environment")
    assert "syntax error in " in line("sweep_syntax:environment")
    assert "give its parameters defaults" in line("sweep_needs_args:Plugin")
    assert "KeyError: 'ORDERDESK_URL'" in line("sweep_factory_raises:environment")
    missing = line("orderdesk_not_on_the_path.plugin:environment")
    assert "PYTHONPATH" in missing and "'orderdesk_not_on_the_path'" in missing
    # the CLI's path holds its own scripts folder, not the working directory: only an
    # installed package or PYTHONPATH makes a plugin importable
    assert "make it importable" in missing and "run from the folder" not in missing
    assert "package.module:Object" in line(":")


ENUMS = {
    "--split",
    "--model",
    "--faults",
    "--judge",
    "--curator",
    "--executor",
    "--fail-on",
    "--stages",
    "--tolerance",
    "--meta",
    "--search",
    "--reflector",
    "--label",
    "--env",
    "--semver",
    "--name",
    "--policy",
    "--redo",
    "--set",
}


def _empty_cases() -> Iterator[Any]:
    for p in PARAMS:
        if p.flag in ENUMS and p.command in BASE:
            yield pytest.param(p.command, p.flag, id=f"{p.command} {p.flag}")


@pytest.mark.parametrize(("command", "flag"), list(_empty_cases()))
def test_an_empty_string_is_refused_in_one_line(
    command: str, flag: str, home: Home, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _with(_fill(BASE[command], home, tmp_path / "new"), flag, "")
    code, out, err = _run(argv, capsys)
    _one_line(code, out, err, needle=(flag,))


# -- arguments that name a file or a version, and what the issue saw --------------------------
TARGETS = (
    [
        ("memory", "import", bad)
        for bad in ("missing", "folder", "binary", "not-json", "wrong-shape")
    ]
    + [("memory", "export", "folder"), ("guard", "export", "folder")]
    + [
        ("guard", "import", bad)
        for bad in ("missing", "folder", "binary", "not-json", "wrong-shape")
    ]
)


@pytest.mark.parametrize(
    ("group", "action", "bad"), [pytest.param(*t, id=" ".join(t)) for t in TARGETS]
)
def test_a_bad_import_or_export_file_is_refused_in_one_line(
    group: str, action: str, bad: str, home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--registry", str(home.files["registry"])]
    if group == "memory":
        where += ["--path", str(home.files["memory"])]
    code, out, err = _run(["evolve", group, action, str(home.files[bad]), *where], capsys)
    _one_line(code, out, err, needle=(str(home.files[bad]),))


@pytest.mark.parametrize("target", ["v99", "vx", "0"])
def test_a_memory_version_that_is_not_there_is_refused_in_one_line(
    target: str, home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--registry", str(home.files["registry"]), "--path", str(home.files["memory"])]
    code, out, err = _run(["evolve", "memory", "restore", target, *where], capsys)
    _one_line(code, out, err, needle=(target, f"version {target.lstrip('v')}"), codes=(1, 2))


def test_an_unknown_candidate_is_one_line_exit_1(
    home: Home, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _fill(BASE["prompt-evolve evaluate"], home, tmp_path / "new")
    argv[2] = "42"
    code, out, err = _run(argv, capsys)
    _one_line(code, out, err, needle=("has no version 42",), codes=(1,))
    assert "evoharness registry versions prompt shop" in err and "registry.versions(" not in err


def test_monitor_says_in_one_line_that_langfuse_does_not_answer(
    home: Home, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def hang_up() -> None:  # accepts and closes every connection: no HTTP answer, ever
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.close()

    worker = threading.Thread(target=hang_up, daemon=True)
    worker.start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}"
    monkeypatch.setenv("LANGFUSE_BASE_URL", url)
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", "pk-lf-sweep")
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk-lf-sweep")
    try:
        argv = ["monitor", "--langfuse", "--db", str(home.files["traces"]), "--no-record"]
        code, out, err = _run(argv, capsys)
    finally:
        stop.set()
        worker.join(5)
        server.close()
    _one_line(code, out, err, needle=(f"Langfuse at {url} did not answer",), codes=(1,))


@pytest.mark.parametrize("item", ["lr=-1", "lr=inf", "alpha=7", "steps=nan", "steps=0"])
def test_weights_run_set_holds_the_bounds_of_the_option(
    item: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["weights", "run", "--workdir", str(tmp_path / "w"), "--set", item]
    code, out, err = _run([*argv, "--registry", str(tmp_path / "r.db")], capsys)
    _one_line(code, out, err, needle=(f"--set {item}",))
    assert not (tmp_path / "w" / "settings.json").exists()
