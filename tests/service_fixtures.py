"""The real services the review suites share, one per test session (conftest.py registers these
fixtures once, so the FiftyOne, Label Studio and mask-review suites share one MongoDB and one
Label Studio server instead of starting one per module)."""
from __future__ import annotations

import os
import secrets
from types import SimpleNamespace

import httpx
import pytest

from curate.review.database import start_labelstudio, start_mongod
from curate.review.provision import provision_labelstudio, provision_mongod

EMAIL = "reviewer@example.com"
_ENV = ("FIFTYONE_DATABASE_URI", "FIFTYONE_DATABASE_VALIDATION", "FIFTYONE_DO_NOT_TRACK")


@pytest.fixture(scope="session")
def mongo(tmp_path_factory):
    """A real mongod for this session; FiftyOne is pointed at it through the environment."""
    binaries = provision_mongod()  # cached in .services/mongodb after the first run
    server = start_mongod(tmp_path_factory.mktemp("mongo") / "db", binaries=binaries)
    saved = {k: os.environ.get(k) for k in _ENV}
    os.environ.update(FIFTYONE_DATABASE_URI=server.uri, FIFTYONE_DATABASE_VALIDATION="false", FIFTYONE_DO_NOT_TRACK="true")
    connect_fiftyone(server.uri)
    yield server
    import fiftyone.core.odm.database as fodb

    fodb._disconnect()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    server.stop()


def connect_fiftyone(uri: str) -> None:
    """Point FiftyOne (one client per process) at ``uri``; other suites may have moved it."""
    from curate.review.fiftyone import import_fiftyone_module

    fo = import_fiftyone_module()  # the first import in a session must dodge the importlib_metadata backport
    import fiftyone.core.odm.database as fodb

    if fo.config.database_uri != uri:
        fodb._disconnect()
        fo.config.database_uri = uri
    fo.config.database_validation = False
    os.environ["FIFTYONE_DATABASE_URI"] = uri


@pytest.fixture()
def fo(mongo):
    import fiftyone

    connect_fiftyone(mongo.uri)
    return fiftyone


@pytest.fixture(scope="session")
def ls(tmp_path_factory):
    """A Label Studio server for this session (its own venv; local-files under ``docroot``)."""
    base = tmp_path_factory.mktemp("labelstudio")
    docroot = base / "docroot"
    docroot.mkdir()
    token = secrets.token_hex(20)
    venv = provision_labelstudio()  # cached in .services/labelstudio-venv after the first run
    server = start_labelstudio(base / "data", username=EMAIL, password=secrets.token_urlsafe(16), token=token,
                               document_root=docroot, venv=venv)
    client = httpx.Client(base_url=server.url, headers={"Authorization": f"Token {token}"}, timeout=60)
    yield SimpleNamespace(url=server.url, token=token, docroot=docroot, http=client, server=server)
    client.close()
    server.stop()


