"""The Python API checks on the driver (issue 44): each function takes only its own config types and the
columns it needs, refused with one error naming the right function or the missing columns before any Ray work
(an EmbedderConfig given to extract ran embedding and failed in a worker after 33-50 s; a SemanticConfig given
to embed silently ran extraction)."""

from __future__ import annotations

import pytest

from verbatim_batch import api


def test_a_config_of_another_function_is_refused_naming_it(ray_local):
    import ray

    chunks = ray.data.from_items([{"chunk_id": "c", "paper_id": "p", "context": "", "text": "t"}])
    with pytest.raises(TypeError, match=r"api.embed takes EmbedderConfig, not SemanticConfig \(that configures "
                                        r"api.extract\)"):
        api.embed(chunks, api.SemanticConfig())
    with pytest.raises(TypeError, match=r"api.extract takes SemanticConfig or HighlighterConfig or LLMConfig, not "
                                        r"EmbedderConfig \(that configures api.embed\)"):
        api.extract(chunks, api.EmbedderConfig())
    with pytest.raises(TypeError, match="api.retrieve takes RetrieverConfig, not ChunkerConfig"):
        api.retrieve(chunks, api.ChunkerConfig())
    with pytest.raises(TypeError, match="api.chunk takes ChunkerConfig, not dict"):
        api.chunk(chunks, {"max_chars": 100})


def test_missing_columns_are_named_before_anything_runs(ray_local):
    import ray

    rows = ray.data.from_items([{"question": "q", "passage": "p"}])
    with pytest.raises(ValueError, match=r"api.extract needs the column\(s\) query, chunk; the dataset has "
                                         r"question, passage"):
        api.extract(rows)
    with pytest.raises(ValueError, match=r"api.retrieve needs the column\(s\) query"):
        api.retrieve(rows, "/nonexistent/index")  # the columns first: the index is never looked at
    with pytest.raises(ValueError, match=r"api.chunk needs the column\(s\) paper_id, markdown"):
        api.chunk(rows)
    # a preprocess function may make the columns: then the workers check them as they run
    renamed = api.extract(rows, preprocess=lambda r: {"query": r["question"], "chunk": r["passage"]})
    assert renamed is not None


def test_a_text_column_of_another_type_is_refused_before_any_task(ray_local):
    """A ``markdown`` column of integers failed inside a worker (RayTaskError(ArrowConversionError)); it is one
    ValueError naming the column, from the dataset's schema, before any task runs (issue 53, item 7)."""
    import ray

    papers = ray.data.from_items([{"paper_id": "P1", "markdown": 5}, {"paper_id": "P2", "markdown": 7}])
    with pytest.raises(ValueError, match=r"api.chunk: column 'markdown' holds int64 values; it needs text"):
        api.chunk(papers)
    pairs = ray.data.from_items([{"query": "q", "chunk": 3.5}])
    with pytest.raises(ValueError, match=r"api.extract: column 'chunk' holds double values"):
        api.extract(pairs)
    assert api.chunk(ray.data.from_items([{"paper_id": 1, "markdown": "# A\n\ntext"}])) is not None  # ids: any
