"""What one run can hold: the ceilings of the count and size options, declared here once.

Each count or size option names its ceiling (``option(10, "...", low=1, high=PER_QUERY)``), so a value past it is
refused at parse time in one line, never by a Ray task allocating it (``retrieve --k 4294967296`` once asked a
worker for 96 GiB). The ceilings are far beyond any useful value; one above what the data holds means "all".
"""

from __future__ import annotations

PER_QUERY = 1_000_000  # chunks, candidates or spans per query (--k, --depth, --top-k): 12 MB per query and method
BATCH = 1_000_000  # rows, examples or documents per batch, call or request (--batch-rows, --docs-per-request)
TOKENS = 16_777_216  # tokens (2**24) of a sequence, a window, a stride or a batch's budget: past every model
CHARS = 2**31 - 1  # characters of one chunk or gap: the most one Arrow string value holds
ROWS = 1_000_000_000  # rows of a table one run reads or writes: papers sampled, spans, files, runs kept
WORKERS = 100_000  # CPUs, GPUs, actors, engines, workers or requests in flight: past the largest Ray clusters
THREADS = 4096  # threads of one process
RETRIES = 1000  # retries and restarts
SEED = 2**32 - 1  # numpy's (and so the trainers') seed range
DIMS = 65_536  # dimensions of a vector, or its product quantizer's sub-vectors
SIZE_MB = 1_048_576  # a size in MB (1 TiB): a file, a paper
SIZE_GB = SIZE_MB // 1024  # a size in GB: a model's cache
