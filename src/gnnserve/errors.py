"""Typed errors. Each carries the name of the offending field so the HTTP layer can report it."""

from __future__ import annotations

ECHO_CHARS = 64  # longest client string quoted back in an error message
MAX_MESSAGE_CHARS = 512  # longest error message answered (the rest is cut)


def echo(value: object, limit: int = ECHO_CHARS) -> str:
    """``repr(value)`` cut to about ``limit`` characters, saying how long it was.

    Every message that quotes a client's value quotes it through this."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} chars)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def cut(text: str, limit: int) -> str:
    """``text`` when at most ``limit`` characters, else its start plus how long it was, the
    whole at most ``limit`` characters."""
    if len(text) <= limit:
        return text
    suffix = f"... ({len(text)} chars)"
    return text[: max(0, limit - len(suffix))] + suffix


class GnnServeError(Exception):
    """Base class of every error gnnserve raises on purpose.

    ``field`` names the input that was wrong (``None`` when not about one field);
    ``http_status`` is the status the server answers with; ``retry_after_s`` (seconds), when
    set, is sent as a ``Retry-After`` header: the request may succeed if sent again then.
    """

    http_status = 500
    kind = "internal"
    retry_after_s: float | None = None

    def __init__(
        self, message: str, field: str | None = None, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if retry_after_s is not None:
            self.retry_after_s = retry_after_s

    def to_json(self) -> dict[str, object]:
        """The JSON error body: ``{"error": {"kind", "message", "field"}}``."""
        return {"error": {"kind": self.kind, "message": self.message, "field": self.field}}


def internal_error(exc: BaseException) -> GnnServeError:
    """The 500 a client gets for a bug or an unexpected failure: the exception's type only.

    Its text may hold server paths, addresses or process ids: log it where this is called."""
    return GnnServeError(f"internal error ({type(exc).__name__}); the server log has details")


class InvalidInputError(GnnServeError, ValueError):
    """A request or a dataset is malformed (bad ids, shapes, NaN, unknown option)."""

    http_status = 400
    kind = "invalid_input"


class TooManyNodesError(InvalidInputError):
    """A request asks for more nodes than the configured limit."""

    http_status = 413
    kind = "too_many_nodes"


class PayloadTooLargeError(GnnServeError):
    """A request body exceeds the server's limit (``server.max_body_bytes``), as sent or as
    it expands once decoded."""

    http_status = 413
    kind = "payload_too_large"


class NeedsMoreMemoryError(GnnServeError):
    """A request needs more memory than the instance that would run it has (serverless
    ``--memory-mb``): retrying it does not help; a larger limit or a smaller request does."""

    http_status = 413
    kind = "needs_more_memory"


class UnknownModelError(GnnServeError, KeyError):
    """The request names a model the server does not serve."""

    http_status = 404
    kind = "unknown_model"

    def __str__(self) -> str:  # KeyError would quote the message
        return self.message


class OverloadedError(GnnServeError):
    """The admission queue is full: the caller should back off and retry."""

    http_status = 429
    kind = "overloaded"
    retry_after_s = 1.0


class WorkerFailedError(GnnServeError):
    """A worker process serving this request died; it is being replaced: retry.

    The message is generic on purpose (details such as actor ids and addresses go to the log).
    """

    http_status = 503
    kind = "worker_failed"
    retry_after_s = 1.0


class UnavailableError(GnnServeError):
    """What the request needs is not there yet (e.g. no sensor round has arrived); retry."""

    http_status = 503
    kind = "unavailable"


class DeadlineExceededError(GnnServeError):
    """A request waited in the queue past its deadline and was dropped before compute."""

    http_status = 504
    kind = "deadline_exceeded"


class ShuttingDownError(GnnServeError):
    """The engine is stopping and accepts no new requests."""

    http_status = 503
    kind = "shutting_down"


class StoreFormatError(GnnServeError, ValueError):
    """A store directory is missing files, has the wrong version or fails its checksum."""

    http_status = 500
    kind = "store_format"


class StoreTimeoutError(GnnServeError):
    """A read from a remote store ran past its deadline: the store is slow or the request reads
    too much (retrying may succeed)."""

    http_status = 504
    kind = "store_timeout"
    retry_after_s = 1.0


class ReadOnlyStoreError(GnnServeError):
    """Updates were sent to a server whose store is immutable (started without an update log)."""

    http_status = 409
    kind = "read_only_store"


class StaleEmbeddingsError(GnnServeError):
    """Precomputed embeddings do not belong to the served model or graph version."""

    http_status = 409
    kind = "stale_embeddings"


class MissingEmbeddingsError(GnnServeError):
    """New-node requests need precomputed embeddings and the server has none."""

    http_status = 409
    kind = "no_embeddings"


class NonFiniteOutputError(GnnServeError):
    """The model's outputs for some requested nodes are NaN or inf (refused, never serialised).

    Their features, or their neighbours', hold values the model overflows on.
    """

    http_status = 500
    kind = "non_finite_output"
