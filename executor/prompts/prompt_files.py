"""Prompts from local files: JSONL line by line, JSON, Parquet, Arrow and CSV through Hugging Face `datasets`.

JSONL is read here line by line so that a bad line is named `file:LINE` — the error a user can fix
in an editor; the other formats are tables, read by `datasets` (a folder written by
`Dataset.save_to_disk` too), and a bad row is named `file row N`. Each row's prompt and answer come
from the columns the workload's `data` section names. Nothing is cached on disk: each read lands in
memory from a temporary cache folder, so concurrent workers never share a cache.

A prompt file may come from someone else, so everything is bounded before it is materialised: only
regular files (a FIFO or /dev/zero is refused at once) of at most MAX_FILE_BYTES; JSONL streamed with
a cap on each line; Parquet read in batches after its footer's row count and size are checked
(hetprof.safety.tables), Arrow IPC sized from its batches' metadata before decompression; at most
MAX_ROWS rows of at most MAX_ROW_BYTES; every row nested at most loader.MAX_DEPTH deep, with finite
numbers and no lone surrogates — each refusal one line naming the file (and line or row) and limit.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hetprof.errors import SpecError
from hetprof.executor.prompts.data import Prompt, arithmetic_prompts
from hetprof.safety import safefiles
from hetprof.safety.tables import TableLimits, check_ipc, parquet_rows
from hetprof.specs import DataParams
from hetprof.specs.loader import check_plain

BUILTIN_SIZE = 4096  # the built-in arithmetic set's size (PromptSource.builtin's default)

SUFFIX_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet",
                  ".arrow": "arrow", ".csv": "csv"}
DATASETS_BUILDERS = {"json": "json", "arrow": "arrow", "csv": "csv"}

# Far above real RL prompt sets (GSM8K, MATH, DAPO: thousands to ~1M rows of a few KB), far below
# what stalls a run: a prompt of MAX_ROW_BYTES is ~250k tokens, beyond any model's context.
MAX_FILE_BYTES = 1 << 30  # on disk, any format
MAX_ROWS = 2_000_000
MAX_ROW_BYTES = 1 << 20
MAX_TABLE_BYTES = 1 << 30  # decoded (decompressed, dictionaries expanded)
MAX_TEXT_FILE_BYTES = 64 << 20  # JSON and CSV, parsed whole (here and by `datasets`) into several times their size
MAX_CSV_COLUMNS = 1024
LIMITS = TableLimits(rows=MAX_ROWS, bytes=MAX_TABLE_BYTES, row_bytes=MAX_ROW_BYTES)


def file_format(path: Path, declared: str = "auto") -> str:
    """The format to read `path` as: the declared one, a saved-dataset folder, else by suffix."""
    if declared != "auto":
        return declared
    if path.is_dir():
        return "saved"
    fmt = SUFFIX_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise SpecError(str(path), "data.format", f"a file ending in {', '.join(SUFFIX_FORMATS)} "
                        "or data.format set", path.suffix or "no suffix")
    return fmt


DEFAULT_ANSWER_FIELD = "answer"  # DataParams.answer_field's default
VERL_ANSWER_FIELD = "reward_model.ground_truth"  # where verl's parquet layout keeps the answer


def load_prompts(path: str | Path, prompt_field: str = "prompt", answer_field: str = DEFAULT_ANSWER_FIELD,
                 fmt: str = "auto", answers_for: str | None = None) -> list[Prompt]:
    """Every prompt of a file; a bad row is refused naming the file, the line or row, and the field.

    A file in verl's layout (`reward_model.ground_truth` beside chat-turn prompts) is read without
    options: with the default answer field absent from its first row, its answer is verl's. With
    `answers_for` (the reward that scores against the answers) a row without an answer is refused,
    naming the field and the fields the row has: such a run would train on reward 0 throughout."""
    path = Path(path)
    if not path.exists():
        raise SpecError(str(path), "", "an existing, readable prompt file", "no such file")
    kind = file_format(path, fmt)
    if kind != "saved":
        _check_file(path, MAX_TEXT_FILE_BYTES if kind in ("json", "csv") else MAX_FILE_BYTES)
    rows = _jsonl_rows(path) if kind == "jsonl" else _table_rows(path, kind)
    prompts = []
    for where, row in rows:
        if len(prompts) >= MAX_ROWS:
            raise SpecError(str(path), "", f"at most {MAX_ROWS:,} prompts", "more")
        check_plain(row, where)  # depth, NaN/infinity, lone surrogates: named by row and field
        if not prompts:
            answer_field = layout_answer_field(row, answer_field)
        prompt = _prompt(where, row, prompt_field, answer_field)
        if answers_for and prompt.answer is None:
            raise SpecError(where, answer_field, f"the reference answer reward '{answers_for}' scores against "
                            f"(this row's fields: {_field_names(row)}; name the answer's with "
                            f"--set data.answer_field=FIELD)", "none")
        prompts.append(prompt)
    if not prompts:
        raise SpecError(str(path), "", "at least one prompt", "no rows")
    return prompts


def _check_file(path: Path, limit: int) -> None:
    """A regular file of at most `limit` bytes (a FIFO, a device or a folder is refused at once)."""
    try:
        with safefiles.open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
    except safefiles.NotReadable as exc:
        raise SpecError(str(path), "", "a regular prompt file", str(exc)) from None
    if size > limit:
        raise SpecError(str(path), "", f"a prompt file of at most {limit:,} bytes", f"{size:,} bytes")


def load_jsonl(path: str | Path) -> list[Prompt]:
    """Prompts from a `{"prompt", "answer"}` JSONL file; any bad line is refused with its file and line."""
    return load_prompts(path, fmt="jsonl")


def _jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """Line by line, each line at most MAX_ROW_BYTES: a file without newlines is refused at its first."""
    try:
        f = safefiles.open_regular(path)
    except safefiles.NotReadable as exc:
        raise SpecError(str(path), "", "a regular prompt file", str(exc)) from None
    with f:
        for lineno, raw in enumerate(iter(lambda: f.readline(MAX_ROW_BYTES + 1), b""), start=1):
            if len(raw) > MAX_ROW_BYTES:
                raise SpecError(f"{path}:{lineno}", "", f"a line of at most {MAX_ROW_BYTES:,} bytes", "a longer one")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise SpecError(str(path), "", "UTF-8 text", f"byte {raw[exc.start]:#04x}",
                                position=(lineno, exc.start + 1)) from None
            if not line.strip():
                continue
            try:
                yield f"{path}:{lineno}", json.loads(line, parse_constant=_no_constant)
            except json.JSONDecodeError as exc:
                raise SpecError(str(path), "", "one JSON object per line", f"invalid JSON ({exc.msg})",
                                position=(lineno, exc.colno)) from None
            except (ValueError, RecursionError) as exc:  # NaN, 5000-digit numbers, deep nesting
                problem = "nested too deep" if isinstance(exc, RecursionError) else str(exc)[:120]
                raise SpecError(f"{path}:{lineno}", "", "one plain JSON object per line", problem) from None


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _table_rows(path: Path, kind: str) -> Iterator[tuple[str, Any]]:
    if kind == "parquet":  # in checked batches: the footer and each batch's decoded size come first
        index = 0
        try:
            for batch in parquet_rows(path, LIMITS):
                for row in batch:
                    index += 1
                    yield f"{path} row {index}", row
        except safefiles.NotReadable as exc:
            raise SpecError(str(path), "", "a readable parquet file within the limits", str(exc)) from None
        return
    # the Arrow table converted at once: iterating a Dataset builds each row through its formatter
    for index, row in enumerate(read_table(path, kind).to_list(), start=1):
        yield f"{path} row {index}", row


def _check_arrow(path: Path) -> None:
    """An Arrow file, or every .arrow file of a saved-dataset folder, decodes within LIMITS."""
    files = sorted(path.glob("*.arrow")) if path.is_dir() else [path]
    total = 0
    for file in files:
        try:
            total += os.lstat(file).st_size
            check_ipc(file, LIMITS)
        except safefiles.NotReadable as exc:
            raise SpecError(str(file), "", "a readable Arrow file within the limits", str(exc)) from None
        if total > MAX_FILE_BYTES:
            raise SpecError(str(path), "", f"a dataset of at most {MAX_FILE_BYTES:,} bytes", "more")


def read_table(path: Path, kind: str) -> Any:
    """A `datasets.Dataset` of a table file (or saved folder), held in memory."""
    if kind == "json":
        _check_json_syntax(path)
    if kind in ("arrow", "saved"):
        _check_arrow(path)
    import datasets

    datasets.disable_progress_bars()  # the error below is the one line a user sees, not its log
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        if kind == "saved":
            loaded = datasets.load_from_disk(str(path), keep_in_memory=True)
            return loaded[next(iter(loaded))] if isinstance(loaded, datasets.DatasetDict) else loaded
        with tempfile.TemporaryDirectory(prefix="hetprof-data-") as cache:
            # CSV cells stay text: "7" must not become 7.0, nor an empty answer NaN
            text_cells = {"features": _text_columns(path), "na_filter": False} if kind == "csv" else {}
            return datasets.load_dataset(DATASETS_BUILDERS[kind], data_files=str(path), split="train",
                                         cache_dir=cache, keep_in_memory=True, **text_cells)
    except SpecError:
        raise
    except Exception as exc:  # datasets and pyarrow raise many types; every one means "not this format"
        cause = exc.__cause__ or exc
        first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        raise SpecError(str(path), "", f"a readable {kind} file", first[:200]) from None


def _text_columns(path: Path) -> Any:
    """Every column of a CSV file typed as text (its header names them)."""
    import csv

    import datasets

    with safefiles.open_regular(path) as f:
        head = f.read(MAX_ROW_BYTES + 1)
    first = head.split(b"\n", 1)[0]
    if len(first) > MAX_ROW_BYTES:
        raise SpecError(str(path), "", f"a CSV header line of at most {MAX_ROW_BYTES:,} bytes", "a longer one")
    header = next(csv.reader([first.decode("utf-8", "replace").rstrip("\r")]), [])
    if len(header) > MAX_CSV_COLUMNS:
        raise SpecError(str(path), "", f"a CSV file of at most {MAX_CSV_COLUMNS} columns", len(header))
    return datasets.Features({name: datasets.Value("string") for name in header})


def _check_json_syntax(path: Path) -> None:
    """A JSON file's syntax error named by line and column (datasets' own message has neither)."""
    try:
        data = json.loads(safefiles.read_bounded(path, MAX_TEXT_FILE_BYTES).decode("utf-8"),
                          parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise SpecError(str(path), "", "valid JSON", exc.msg, position=(exc.lineno, exc.colno)) from None
    except RecursionError:
        raise SpecError(str(path), "", "JSON nested a few levels deep", "deeper") from None
    except (safefiles.NotReadable, UnicodeDecodeError, ValueError) as exc:
        raise SpecError(str(path), "", "a readable UTF-8 JSON file", str(exc)[:160]) from None
    check_plain(data, str(path))


def _prompt(where: str, row: Any, prompt_field: str, answer_field: str) -> Prompt:
    if not isinstance(row, dict):
        raise SpecError(where, "", f"a JSON object (a row) with '{prompt_field}' (and '{answer_field}')", row)
    value = field_value(row, prompt_field)
    messages = _messages(where, prompt_field, value) if isinstance(value, list) else ()
    text = "\n\n".join(content for _, content in messages) if messages else value
    if not isinstance(text, str) or not text.strip():
        # column names come from the file: escaped, so the refusal stays one line
        names = ", ".join(str(k).encode("unicode_escape").decode("ascii") for k in row)
        hint = "" if value is not None else f" (columns: {names or 'none'})"
        raise SpecError(where, prompt_field, f"a non-empty string or a list of chat turns{hint}", value)
    answer = field_value(row, answer_field)
    if isinstance(answer, bool) or not (answer is None or isinstance(answer, (str, int, float))):
        raise SpecError(where, answer_field, "a string or a number (or absent)", answer)
    return Prompt(text, None if answer is None or answer == "" else str(answer), source=where, messages=messages)


def layout_answer_field(row: Any, answer_field: str) -> str:
    """The answer field a file is read with: as named, or verl's when the default is absent from a
    row that holds verl's `reward_model.ground_truth`."""
    if (answer_field == DEFAULT_ANSWER_FIELD and isinstance(row, dict) and DEFAULT_ANSWER_FIELD not in row
            and field_value(row, VERL_ANSWER_FIELD) is not None):
        return VERL_ANSWER_FIELD
    return answer_field


def _field_names(row: dict, limit: int = 24) -> str:
    """A row's fields as a user names them (nested ones dotted, one level down), escaped to one line."""
    names = [f"{key}.{sub}" if sub is not None else str(key) for key, value in row.items()
             for sub in (list(value) if isinstance(value, dict) and value else [None])]
    shown = ", ".join(str(n).encode("unicode_escape").decode("ascii") for n in names[:limit])
    return (shown + (f", … ({len(names) - limit} more)" if len(names) > limit else "")) or "none"


def field_value(row: dict, name: str) -> Any:
    """`row[name]`, else the nested field a dotted name spells (`reward_model.ground_truth`); None if absent."""
    if name in row:
        return row[name]
    value: Any = row
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _messages(where: str, name: str, turns: list) -> tuple[tuple[str, str], ...]:
    """A chat prompt's turns ([{"role", "content"}, ...], as verl and OpenRLHF datasets hold them)."""
    out = []
    for i, turn in enumerate(turns):
        if not (isinstance(turn, dict) and isinstance(turn.get("role"), str) and isinstance(turn.get("content"), str)):
            raise SpecError(where, f"{name}[{i}]", "a chat turn {\"role\": str, \"content\": str}", turn)
        out.append((turn["role"], turn["content"]))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class PromptSets:
    """The training prompts and the validation prompts (empty: no validation) of a run."""

    train: list[Prompt]
    validation: list[Prompt]


def resolve(path: str | None, base_dir: str | None) -> Path | None:
    """A spec's file reference: relative paths are relative to the spec's folder."""
    if not path:
        return None
    p = Path(path).expanduser()
    return p if p.is_absolute() or not base_dir else Path(base_dir) / p


ALLOW_OUTSIDE_FLAG = "--allow-prompts-outside"


def check_confined(data: DataParams, base_dir: str | None, plan_path: str | Path, user_named: Sequence[str] = ()
                   ) -> None:
    """A plan's own prompt files (`data.prompts`, `data.validation`) lie inside the plan's folder:
    a plan someone sent must not make the run read (and copy into its log) a file of the user's
    elsewhere. Fields in `user_named` (set on the command line) are the user's own choice."""
    folder = Path(plan_path).resolve().parent
    for name in ("prompts", "validation"):
        if f"data.{name}" in user_named:
            continue
        target = resolve(getattr(data, name), base_dir)
        if target is not None and not target.resolve().is_relative_to(folder):
            raise SpecError(str(plan_path), f"data.{name}", f"a file inside the plan's folder {folder} (a shared "
                            f"plan reads no file of yours elsewhere; pass {ALLOW_OUTSIDE_FLAG} if you trust it, "
                            "or name the file with --prompts)", str(target))


def prompt_sets(data: DataParams, base_dir: str | None, prompts: str | None = None, seed: int = 0,
                answers_for: str | None = None) -> PromptSets:
    """The run's prompts: `prompts` (--prompts) or the spec's `data.prompts`, else the built-in set;
    validation from `data.validation`, or the `data.validation_size` prompts a seeded shuffle puts
    first, held out of training (the same on every rank and every resume). With `answers_for` (a
    reward that scores against answers) every prompt read from a file must have one."""
    source = Path(prompts) if prompts else resolve(data.prompts, base_dir)
    if source is None:
        train = arithmetic_prompts(BUILTIN_SIZE, seed=seed)
    else:
        train = load_prompts(source, data.prompt_field, data.answer_field, data.format, answers_for)
    validation_file = resolve(data.validation, base_dir)
    if validation_file is not None:
        return PromptSets(train, load_prompts(validation_file, data.prompt_field, data.answer_field, data.format,
                                              answers_for))
    if not data.validation_size:
        return PromptSets(train, [])
    if data.validation_size >= len(train):
        raise SpecError(str(source or "the built-in prompts"), "data.validation_size",
                        f"fewer than the {len(train)} prompts there", data.validation_size)
    order = list(range(len(train)))
    random.Random(f"validation:{seed}").shuffle(order)
    validation = [train[i] for i in sorted(order[: data.validation_size])]
    held = set(validation)  # a duplicate of a held-out prompt is held out too: no validation leaks
    return PromptSets([p for p in train if p not in held], validation)
