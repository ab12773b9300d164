"""Worker process for large nsys exports: read the kernel tables, write Arrow IPC files.

Run as `python -m moetune.analyzer.readers.nsys_worker DB SHOWN OUT_DIR` by `moetune.analyzer.readers.nsys` (a
fresh interpreter, so nothing of the caller's `__main__` is re-executed). Writes one
`<frame>.arrow` per frame and `notes.json` with the schema notes (missing tables/columns); a
UserError is written to `error.txt` and exits 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from moetune.analyzer.readers.nsys import SIDE_FRAMES, _worker_share, slim_side_frame
from moetune.analyzer.readers.nsys_db import Db

from moetune.errors import UserError


def main(argv: list[str]) -> int:
    db_path, shown, out_dir = (Path(a) for a in argv)
    try:
        db = Db.open(db_path, shown=shown)
        try:
            frames = _worker_share(db, None)  # kernel names are resolved by the caller
        finally:
            db.close()
    except UserError as exc:
        (out_dir / "error.txt").write_text(exc.message)
        return 2
    layouts = {}
    for name, df in zip(SIDE_FRAMES, frames, strict=True):
        slim, layouts[name] = slim_side_frame(df)
        slim.write_ipc(out_dir / f"{name}.arrow")
    notes = {"tables": db.missing_tables, "columns": db.missing_columns, "layouts": layouts}
    (out_dir / "notes.json").write_text(json.dumps(notes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
