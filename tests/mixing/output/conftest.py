"""The build roots of the contract's storage tests (a local folder, a prefix on a real S3 endpoint), for the
commit records written into them."""

from tests.contract.conftest import s3, store

__all__ = ["s3", "store"]
