"""The ground floor: what every other floor stands on, with no Ray and no models run.

Table schemas and ids (``tables``), option declarations (``options``), the one reader of small input tables
(``records``), URIs and object stores (``storage``), safe model loading (``models``), credential redaction
(``redact``), crash-test hooks (``faults``), the fan-out hook the engine fills (``tasks``), and run folders:
staging, manifests, atomic commit, the nightly pointer (``runs``).
"""

__version__ = "0.1.0"
