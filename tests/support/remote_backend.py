"""A stand-in for a remote file store (S3, Petrel) in the dataset-check tests.

``nalatest:///abs/path`` names the local file ``/abs/path``, but only through mmengine's
fileio: the URI prefix makes ``get_file_backend`` pick this backend, exactly as ``s3://`` picks
a remote one, while ``os.path`` sees a path that does not exist. Data that loads through it
proves that a check reads remote data through the backend (or leaves it to the loader)
instead of testing local folders.
"""
from contextlib import contextmanager
from typing import Iterator

from mmengine.fileio import register_backend
from mmengine.fileio.backends import LocalBackend

PREFIX = 'nalatest://'


class DirectoryStoreBackend(LocalBackend):
    """Serves ``nalatest://<absolute local path>`` through the local file system."""

    @staticmethod
    def _local(path) -> str:
        path = str(path)
        if not path.startswith(PREFIX):
            raise ValueError(f'expected a {PREFIX} path, got {path!r}')
        return path[len(PREFIX):]

    def get(self, filepath) -> bytes:
        return super().get(self._local(filepath))

    def get_text(self, filepath, encoding='utf-8') -> str:
        return super().get_text(self._local(filepath), encoding)

    def exists(self, filepath) -> bool:
        return super().exists(self._local(filepath))

    def isdir(self, filepath) -> bool:
        return super().isdir(self._local(filepath))

    def isfile(self, filepath) -> bool:
        return super().isfile(self._local(filepath))

    @contextmanager
    def get_local_path(self, filepath) -> Iterator[str]:
        yield self._local(filepath)

    def list_dir_or_file(self, dir_path, *args, **kwargs) -> Iterator[str]:
        return super().list_dir_or_file(self._local(dir_path), *args, **kwargs)


register_backend('nalatest', DirectoryStoreBackend, force=True, prefixes='nalatest')


def remote(path) -> str:
    """The ``nalatest://`` URI of a local absolute path."""
    return PREFIX + str(path)
