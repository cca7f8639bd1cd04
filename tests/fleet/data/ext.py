import json
import os
import pathlib
import time

d = pathlib.Path(os.environ["MUSUBI_JOB_DIR"])
time.sleep(8)
(d / "eval.json").write_text(json.dumps({"metrics": {"top1": 0.5}, "primary_metric": "top1"}))
