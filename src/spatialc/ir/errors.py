"""The base of every error spatialc raises on purpose. It lives in the IR, the package everything else imports,
so that the IR's own errors (a document that is not ours) are spatialc errors too."""


class SpatialError(Exception):
    """Base of every error spatialc raises on purpose."""
