"""The datasets page (list, preview rows) and the secrets page (names and scopes only)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from osmosis.platform.deps import Db
from osmosis.platform.web import library
from osmosis.platform.web.render import render
from osmosis.platform.web.session import PageViewer

router = APIRouter()


@router.get("/datasets")
def datasets(request: Request, db: Db, viewer: PageViewer) -> Response:
    rows = library.list_datasets(db, user=viewer.user)
    return render(request, "datasets.html", viewer, nav="datasets", rows=rows)


@router.get("/datasets/{dataset_id}")
def dataset(dataset_id: str, request: Request, db: Db, viewer: PageViewer) -> Response:
    preview = library.dataset_preview(db, user=viewer.user, dataset_id=dataset_id)
    return render(request, "dataset.html", viewer, nav="datasets", preview=preview)


@router.get("/secrets")
def secrets(request: Request, db: Db, viewer: PageViewer) -> Response:
    rows = library.list_secret_names(db, user=viewer.user)
    return render(request, "secrets.html", viewer, nav="secrets", rows=rows)
