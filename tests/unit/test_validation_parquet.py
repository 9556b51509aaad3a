"""Parquet inputs: chat rows from prompt or messages, embedding rows from input, the id
column as identity (else row_index), read a batch at a time."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from inference.pricing import Usage
from inference.rows.core import InputRejected
from jobs.validation import validate_parquet
from jobs.validation.parquet import BATCH_ROWS
from tests.unit.test_validation_media_files import data_uri, png_bytes
from tests.unit.test_validation_support import options, words


def write(tmp_path: Path, columns: dict[str, list[object]], *,
          row_group_size: int | None = None) -> Path:
    path = tmp_path / "input.parquet"
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


def refusal(source: object, model_id: str, **fields: object) -> str:
    with pytest.raises(InputRejected) as caught:
        validate_parquet(source, options(model_id, **fields),  # type: ignore[arg-type]
                         count_tokens=words)
    return caught.value.message


def test_chat_rows_from_a_prompt_column(tmp_path: Path) -> None:
    path = write(tmp_path, {"prompt": ["one two", "three"], "other": [1, 2]})
    report = validate_parquet(path, options("qwen3.8-27b"), count_tokens=words)
    assert report.rows == 2 and report.endpoint == "/v1/chat/completions"
    assert report.usage == Usage(input_tokens=(2 + 4) + (1 + 4))
    assert report.thinking_rows == 2 and report.effort_rows == {"xhigh": 2}
    off = validate_parquet(path, options("qwen3.8-27b", reasoning=False), count_tokens=words)
    assert off.thinking_rows == 0


def test_chat_rows_from_a_messages_column_carry_media(tmp_path: Path) -> None:
    image = {"type": "image_url", "image_url": {"url": data_uri("image/png", png_bytes())}}
    messages = [[{"role": "system", "content": "be brief"},
                 {"role": "user", "content": [{"type": "text", "text": "what is it"}, image]}],
                [{"role": "user", "content": "hi"}]]
    path = write(tmp_path, {"messages": [json.dumps(m) for m in messages]})
    report = validate_parquet(path, options("gemma4-12b"), count_tokens=words)
    assert report.usage == Usage(input_tokens=6 + 7 + 5, media_tokens=256, images=1)


def test_a_native_list_of_messages_column_is_read_too(tmp_path: Path) -> None:
    path = write(tmp_path, {"messages": [[{"role": "user", "content": "a b c"}]]})
    report = validate_parquet(path, options("gemma4-12b"), count_tokens=words)
    assert report.usage.input_tokens == 7


def test_embedding_rows_from_an_input_column(tmp_path: Path) -> None:
    path = write(tmp_path, {"id": ["a", "b"], "input": ["one two", "three"]})
    report = validate_parquet(path, options("qwen3-embedding-8b"), count_tokens=words)
    assert report.endpoint == "/v1/embeddings"
    assert report.usage == Usage(input_tokens=3 + 2)  # each string + end-of-text


@pytest.mark.parametrize("columns,model_id,expected", [
    ({"messages": ['[{"role": "user", "content": "ok"}]', "not json"]}, "gemma4-12b",
     "Row 1 (row_index): messages is not valid JSON: it must be a JSON list of messages"),
    ({"prompt": ["ok", None]}, "gemma4-12b", "Row 1 (row_index): prompt is empty"),
    ({"id": ["a", "b", "a"], "prompt": ["x", "y", "z"]}, "gemma4-12b",
     "Row 'a': id is used by an earlier row; every row needs its own id"),
    ({"id": [7, None], "prompt": ["x", "y"]}, "gemma4-12b",
     "Row 1 (row_index): id is empty; an id column names every row"),
    ({"id": ["x-1"], "messages": ['[{"role": "user", "content": [{"type": "file"}]}]']},
     "gemma4-12b",
     "Row 'x-1': unsupported content part type 'file': supported types are text, image_url, "
     "input_audio, audio_url, video_url"),
    ({"id": [1, 2], "input": ["fine", ""]}, "qwen3-embedding-8b",
     "Row '2': embeddings input must be a non-empty string"),
    ({"text": ["x"]}, "gemma4-12b",
     "A parquet input for a chat model needs a 'prompt' column (text) or a 'messages' column "
     "(JSON text)."),
    ({"prompt": ["x"]}, "qwen3-vl-embedding-2b",
     "A parquet input for an embedding model needs an 'input' column."),
    ({"prompt": ["x"]}, "laya",
     "Model 'laya' takes JSONL input only: a decision job's rows are JSONL lines with state "
     "and questions."),
    ({"prompt": pa.array([], pa.string())}, "gemma4-12b",
     "The input file has no rows: a job needs at least one request."),
])
def test_parquet_violations(tmp_path: Path, columns: dict[str, list[object]], model_id: str,
                            expected: str) -> None:
    assert refusal(write(tmp_path, columns), model_id) == expected


def test_a_file_that_is_not_parquet_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "input.parquet"
    path.write_bytes(b"not parquet at all")
    assert refusal(path, "gemma4-12b").startswith("The input is not a readable parquet file (")


def test_many_row_groups_are_read_in_batches_and_rows_keep_their_index(tmp_path: Path) -> None:
    rows = BATCH_ROWS + 500
    prompts: list[object] = ["a b"] * rows
    path = write(tmp_path, {"prompt": prompts}, row_group_size=1000)
    report = validate_parquet(path, options("gemma4-12b"), count_tokens=words)
    assert report.rows == rows and report.usage.input_tokens == rows * 6
    prompts[rows - 3] = None
    broken = write(tmp_path, {"prompt": prompts}, row_group_size=1000)
    assert refusal(broken, "gemma4-12b") == f"Row {rows - 3} (row_index): prompt is empty"


def test_a_file_object_is_a_source_too(tmp_path: Path) -> None:
    buffer = io.BytesIO(write(tmp_path, {"prompt": ["hello"]}).read_bytes())
    assert validate_parquet(buffer, options("gemma4-12b"), count_tokens=words).rows == 1
