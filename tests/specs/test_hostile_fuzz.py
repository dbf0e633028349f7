"""Property-based fuzzing of every loader of shared input: import, merge, plan and spec files.

Property: each input either loads correctly (everything stored passes the import checks) or is
refused with one line and exit 2 — never a traceback — and after a refusal the database is
byte-for-byte and row-for-row what it was. Memory is traced per input and must stay under a cap.

The suite tries a few dozen inputs per loader; `make campaign` tries thousands on every surface
(helpers/campaign.py), this file's included, and prints what was refused and what accepted.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers.campaign import CAMPAIGN, fuzz, summary, tally
from helpers.hostile_files import dump, export_lines, fill
from hypothesis import given
from hypothesis import strategies as st

from hetprof.cli import cli
from hetprof.errors import HetprofError
from hetprof.executor.launch.checks import load_plan
from hetprof.executor.launch.sizebounds import check_run_sizes
from hetprof.profiles import ProfileDB, export
from hetprof.profiles.content import content_id
from hetprof.profiles.rowchecks import check_row
from hetprof.profiles.schema import TABLES
from hetprof.specs import ClusterSpec, WorkloadSpec

ROOT = Path(__file__).resolve().parents[2]
FUZZ = fuzz(25)
LIMITS = ["--max-bytes", "4M", "--max-rows", "5000", "--max-row-bytes", "256K", "--deadline", "20"]
MEMORY_CAP = 256 * 2**20  # traced Python allocations while one input is read
ADDRESS_SPACE_HEADROOM = 6 * 2**30
pytestmark = pytest.mark.timeout(7200 if CAMPAIGN else 300)  # the campaign's thousands of inputs take a while


@pytest.fixture(scope="module", autouse=True)
def _report():
    """Cap this process's address space while fuzzing (a blow-up is then a MemoryError, not the OOM
    killer taking the machine's other work with it); print what was tried."""
    import resource

    limits = resource.getrlimit(resource.RLIMIT_AS)
    in_use = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
    cap = in_use + ADDRESS_SPACE_HEADROOM
    if limits[1] != resource.RLIM_INFINITY:
        cap = min(cap, limits[1])
    resource.setrlimit(resource.RLIMIT_AS, (cap, limits[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, limits)
    print(f"\n{summary()}\nlimits {' '.join(LIMITS)}; memory cap {MEMORY_CAP >> 20} MiB")


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> dict[str, Path]:
    """A real profile (its database and export), and a target database with other data."""
    root = tmp_path_factory.mktemp("seed")
    fill(root / "src.db", host="node-a", n=12)
    with ProfileDB(root / "src.db") as db:
        export(db, root / "src.hpx")
    fill(root / "target.db", host="node-t", n=5)
    return root


def _all_rows_valid(path: Path) -> None:
    with ProfileDB(path) as db:
        for name, table in TABLES.items():
            for row in db.conn.execute(f"SELECT * FROM {name}"):
                check_row(table, row, f"stored {name}")


def _run_refusable(args: list[str], target: Path) -> str:
    """Run a db command on `target`; it succeeds with valid rows stored, or refuses in one line, unchanged.
    Returns the outcome for the tally."""
    before_bytes, before_rows = target.read_bytes(), dump(target)
    tracemalloc.start()
    try:
        result = CliRunner().invoke(cli, [*args, "--db", str(target), *LIMITS])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_CAP, f"{peak >> 20} MiB traced"
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    if result.exit_code == 0:
        _all_rows_valid(target)
        return "accepted"
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert dump(target) == before_rows
    assert target.read_bytes() == before_bytes
    return "refused"


# ---- import -----------------------------------------------------------------------------------------

_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                     max_leaves=12)


@st.composite
def _export_edits(draw, lines: list[bytes]) -> bytes:
    """An export with a value replaced, a line re-spelled, dropped or repeated, or raw bytes changed;
    the checksum and counts made to match again (or not) so every check is reached."""
    rows = [json.loads(line) for line in lines]
    kind = draw(st.sampled_from(["value", "respell", "drop", "repeat", "bytes"]))
    i = draw(st.integers(0, len(rows) - 1))
    if kind == "value":
        j = draw(st.integers(0, len(rows[i]) - 1))
        rows[i][j] = draw(_JSON)
        if draw(st.booleans()):  # as an adversary would: the id recomputed, so the value checks are reached
            rows[i] = _readdressed(rows[i])
    body = [json.dumps(r, ensure_ascii=draw(st.booleans()), separators=(",", ":")).encode() + b"\n" for r in rows]
    if kind == "respell":
        body[i] = json.dumps(rows[i], indent=draw(st.sampled_from([None, 1]))).replace("\n", "").encode() + b"\n"
    elif kind == "drop":
        del body[i]
    elif kind == "repeat":
        body.insert(i, body[i])
    elif kind == "bytes":
        raw = bytearray(body[i])
        at = draw(st.integers(0, len(raw) - 1))
        raw[at:at + 1] = draw(st.binary(min_size=0, max_size=3))
        body[i] = bytes(raw)
    try:
        counts = None if draw(st.booleans()) else {"devices": 1}
        return export_lines(body, counts=counts)
    except (ValueError, KeyError, TypeError):
        return export_lines(body, counts={})


def _readdressed(row: list) -> list:
    table = TABLES.get(row[0]) if row and isinstance(row[0], str) else None
    if table is None or len(row) != len(table.columns) + 2:
        return row
    try:
        return [row[0], content_id(table.name, row[2:], table.json_flags), *row[2:]]
    except (ValueError, TypeError, UnicodeEncodeError):
        return row


def _export_lines(seed_dir: Path) -> list[bytes]:
    text = gzip.decompress((seed_dir / "src.hpx").read_bytes()).splitlines(keepends=True)
    return text[1:-1]


@FUZZ
@given(data=st.data())
def test_fuzz_import(seed, tmp_path_factory, data):
    work = tmp_path_factory.mktemp("imp")
    target, f = work / "t.db", work / "in.hpx"
    shutil.copy(seed / "target.db", target)
    f.write_bytes(data.draw(_export_edits(_export_lines(seed))))
    tally("import", _run_refusable(["db", "import", str(f)], target))


@FUZZ
@given(raw=st.binary(max_size=2048), compress=st.booleans())
def test_fuzz_import_raw_bytes(seed, tmp_path_factory, raw, compress):
    work = tmp_path_factory.mktemp("raw")
    target, f = work / "t.db", work / "in.hpx"
    shutil.copy(seed / "target.db", target)
    f.write_bytes(gzip.compress(raw) if compress else raw)
    tally("import", _run_refusable(["db", "import", str(f)], target))


# ---- merge ------------------------------------------------------------------------------------------

_SQL_VALUE = (st.none() | st.integers(-2**63, 2**63 - 1) | st.floats() | st.text(max_size=30)
              | st.binary(max_size=30) | st.sampled_from(["{}", '{"m":1}', "[]", "x" * 64, "0" * 64]))


@st.composite
def _db_edits(draw) -> list[tuple[str, tuple]]:
    """SQL that an adversary could run on their database before sharing it."""
    edits: list[tuple[str, tuple]] = []
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from([*TABLES, "meta"]))
        kind = draw(st.sampled_from(["update", "view", "delete", "duplicate", "version", "drop_column"]))
        if kind == "update" and name in TABLES:
            col = draw(st.sampled_from(TABLES[name].column_names))
            edits.append((f"UPDATE {name} SET {col} = ? WHERE rowid IN (SELECT rowid FROM {name} LIMIT 1)"
                          if name != "samples" else f"UPDATE {name} SET {col} = ? WHERE seq = 0", (draw(_SQL_VALUE),)))
        elif kind == "view" and name in TABLES:
            cols = ", ".join(TABLES[name].column_names)
            edits.append((f"ALTER TABLE {name} RENAME TO old_{name}", ()))
            edits.append((f"CREATE VIEW {name} ({cols}) AS SELECT {cols} FROM old_{name}", ()))
        elif kind == "delete":
            edits.append((f"DELETE FROM {name} WHERE rowid IN (SELECT rowid FROM {name} LIMIT 1)"
                          if name != "samples" else "DELETE FROM samples WHERE seq = 1", ()))
        elif kind == "duplicate" and name == "samples":
            edits.append(("INSERT INTO samples SELECT substr(id, 2) || 'a', run_id, seq, params, metrics "
                          "FROM samples WHERE seq = 2", ()))
        elif kind == "version":
            edits.append(("UPDATE meta SET value = ? WHERE key = 'schema_version'", (draw(_SQL_VALUE),)))
        elif kind == "drop_column" and name in TABLES:
            edits.append((f"ALTER TABLE {name} ADD COLUMN extra_{name} TEXT", ()))
    return edits


def _edited(src: Path, edits: list[tuple[str, tuple]], corrupt: tuple[int, bytes] | None) -> None:
    """Apply an adversary's SQL edits to `src`, then overwrite a few of its bytes (None: none)."""
    conn = sqlite3.connect(src)
    for sql, args in edits:
        try:
            conn.execute(sql, args)
        except (sqlite3.DatabaseError, OverflowError):
            pass  # an edit SQLite itself refuses is no input
    conn.commit()
    conn.close()
    if corrupt is not None:
        raw = bytearray(src.read_bytes())
        at, junk = corrupt
        at %= len(raw)
        raw[at:at + len(junk)] = junk
        src.write_bytes(bytes(raw))


_CORRUPT = st.none() | st.tuples(st.integers(0, 2**16), st.binary(min_size=1, max_size=8))


@FUZZ
@given(edits=_db_edits(), corrupt=_CORRUPT)
def test_fuzz_merge(seed, tmp_path_factory, edits, corrupt):
    work = tmp_path_factory.mktemp("merge")
    src, target = work / "theirs.db", work / "t.db"
    shutil.copy(seed / "src.db", src)
    shutil.copy(seed / "target.db", target)
    _edited(src, edits, corrupt)
    tally("merge", _run_refusable(["db", "merge", str(src)], target))


@FUZZ
@given(edits=_db_edits(), corrupt=_CORRUPT)
def test_fuzz_database_opened_directly(seed, tmp_path_factory, edits, corrupt):
    """`--db theirs.db` read by `db export`: refused in one line with the file unchanged and nothing
    written, or exported — and then the export imports cleanly, so only valid rows came out."""
    work = tmp_path_factory.mktemp("direct")
    theirs, out, fresh = work / "theirs.db", work / "out.hpx", work / "fresh.db"
    shutil.copy(seed / "src.db", theirs)
    _edited(theirs, edits, corrupt)
    before = theirs.read_bytes()
    result = CliRunner().invoke(cli, ["db", "export", "--db", str(theirs), str(out)])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    if result.exit_code == 0:
        reimport = CliRunner().invoke(cli, ["db", "import", "--db", str(fresh), str(out)])
        assert reimport.exit_code == 0, reimport.output
        _all_rows_valid(fresh)
        tally("database opened directly", "accepted")
        return
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert theirs.read_bytes() == before and not out.exists()
    tally("database opened directly", "refused")


# ---- plan and spec files ---------------------------------------------------------------------------


def _one_line_refusal(load) -> str:
    """`load()` succeeds or raises a HetprofError whose message is one line; nothing else escapes.
    Returns the outcome for the tally."""
    try:
        load()
    except HetprofError as exc:
        assert exc.exit_code == 2, exc
        assert "\n" not in str(exc) and str(exc), repr(exc)
        return "refused"
    return "accepted"


def _mutate(data, path: list, value):
    if not path:
        return value
    key, rest = path[0], path[1:]
    if isinstance(data, dict) and data:
        k = list(data)[key % len(data)]
        return {**data, k: _mutate(data[k], rest, value)}
    if isinstance(data, list) and data:
        k = key % len(data)
        return [*data[:k], _mutate(data[k], rest, value), *data[k + 1:]]
    return value


_BIG = st.sampled_from([10**18, -1, 0, 2**63, 1e308, "1e999", "x" * 10_000, "\ud800", [[[[[[]]]]]], {"": None}])


@pytest.fixture(scope="module")
def plan_data(tmp_path_factory) -> dict:
    from hetprof.executor.launch.handwritten_plan import handwritten_plan

    cluster = ClusterSpec.from_dict({"name": "cpu", "hosts": [{"name": "localhost", "gpus": {"type": "cpu",
                                                                                              "count": 2}}]})
    base = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny.yaml").to_dict()
    plan = handwritten_plan(cluster, base, {"actor_gen": ["localhost:0"], "ref_infer": ["localhost:1"],
                                            "actor_train": ["localhost:1"]})
    return json.loads(json.dumps(plan.to_dict()))


def _garbled(text: bytes, garble: tuple[int, bytes] | None) -> bytes:
    """`text` with a few bytes overwritten at a drawn offset (None: unchanged): file corruption."""
    if garble is None:
        return text
    at = garble[0] % (len(text) + 1)
    return text[:at] + garble[1] + text[at + len(garble[1]):]


@FUZZ
@given(path=st.lists(st.integers(0, 50), max_size=6), value=_JSON | _BIG, as_text=st.booleans(),
       garble=st.none() | st.tuples(st.integers(0, 10**6), st.binary(max_size=4)))
def test_fuzz_plan_loader(plan_data, tmp_path_factory, path, value, as_text, garble):
    f = tmp_path_factory.mktemp("plan") / "plan.json"
    edited = _mutate(plan_data, path, value)
    text = json.dumps(edited, ensure_ascii=as_text).encode("utf-8", "surrogatepass")
    f.write_bytes(_garbled(text, garble))

    def load() -> None:
        plan = load_plan(f)
        check_run_sizes(plan.workload_spec(), 20)

    tally("plan", _one_line_refusal(load))


_SPECS = sorted((ROOT / "examples" / "clusters").glob("*.yaml")) + sorted((ROOT / "examples" / "workloads").glob("*.yaml"))


@FUZZ
@given(which=st.sampled_from(_SPECS), path=st.lists(st.integers(0, 50), max_size=5), value=_JSON | _BIG,
       garble=st.none() | st.tuples(st.integers(0, 10**5), st.binary(max_size=4)))
def test_fuzz_spec_loaders(tmp_path_factory, which, path, value, garble):
    import yaml

    f = tmp_path_factory.mktemp("spec") / which.name
    data = _mutate(yaml.safe_load(which.read_text()), path, value)
    text = yaml.safe_dump(data, allow_unicode=True).encode("utf-8", "surrogatepass")
    f.write_bytes(_garbled(text, garble))
    cls = ClusterSpec if which.parent.name == "clusters" else WorkloadSpec
    tally(f"{which.parent.name[:-1]} spec", _one_line_refusal(lambda: cls.load(f)))
