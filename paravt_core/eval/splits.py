"""The evaluation splits of SPEC §7, one record each: where the real benchmark's rows and videos
sit in its hub repo, the data contract its rows are held to, its column in the paper's Table 1
(SPEC §6) and the paper's numbers there.

Everything that needs a split reads it from `SPLITS`: the config's split names
(`config.EVAL_SPLITS`), the download (`data/hub.py`), the data stage (`data/stage.py`), the
generated world, which writes its mirror in these real layouts (`data/synth/benchmarks.py`),
the data contracts (`data_contracts/suites.py`, the row format a record names) and the
report's table (`eval/report.py`). A split's row builder lives in `eval/samples.py`
(`SAMPLE_BUILDERS`, under the split's name; `tests/unit/test_eval_splits.py` holds the two to
the same names): that file's bytes key every evaluation's results folder (it words the
prompts), so it is not moved here. This module imports nothing of the project: the typed
config reads it.

| split | repo | annotation file | videos |
|---|---|---|---|
| videomme | lmms-lab/Video-MME | videomme/test-00000-of-00001.parquet | videos_chunked_01.zip: data/<videoID>.mp4 |
| videomme_wsub | (same repo and rows) | (same) | + subtitle.zip: subtitle/<videoID>.srt |
| longvideobench | longvideobench/LongVideoBench | validation-00000-of-00001.parquet | videos.tar.part.aa, .ab, ...: videos/<video_path> |
| lvbench | lmms-lab/LVBench | data/test-00000-of-00001.parquet | videos/<key>.mp4 |
| mlvu | sy1998/MLVU_dev | data/test-00000-of-00001.parquet | video/<video_name> (or video/<n_task>/<video_name>) |
| mmvu | yale-nlp/MMVU | data/validation-00000-of-00001.parquet | <`video` after "/main/">: videos/<Subject>/<n>.mp4 |
| charades | lmms-lab/charades_sta | data/test-00000-of-00001.parquet | Charades_v1_480.zip: Charades_v1_480/<video> |

LongVideoBench's videos come as a tar split into parts (`videos.tar.part.aa`, ...), as the real
repo ships them. MLVU's real repo keeps videos in per-task folders (`1_plotQA/<video_name>`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class BenchmarkLayout:
    """Where a split's annotations and videos sit in its hub repo.

    `video_dir` is the folder (in the repo, or inside `video_archive` when set) that the
    video path a row names is relative to ("" for the root): `<videoID>.mp4` for Video-MME,
    `video_path` for LongVideoBench, `<key>.mp4` for LVBench, `video_name` for MLVU, the
    part of `video` after "/main/" for MMVU, `video` for Charades-STA.
    """

    split: str
    repo_id: str
    annotation_file: str
    video_dir: str
    video_archive: str | None = None
    subtitle_archive: str | None = None
    subtitle_dir: str | None = None

    def video_member(self, relative: str) -> str:
        """The repo (or archive) path of the video a row names by `relative`."""
        return f"{self.video_dir}/{relative}" if self.video_dir else relative


@dataclass(frozen=True)
class EvalSplit:
    """One evaluation split.

    Attributes:
        layout: its real hub layout (the generated world writes the same).
        row_format: the data contract's row format its rows follow (a key of
            `data_contracts.suites.ROW_FORMATS`: columns, id, answer layout, value rules).
        column: its header in the paper's Table 1 (SPEC §6); None: not a benchmark of the
            paper (a validation split), so it is no default split and has no column.
        paper: the paper's Table 1 number in each of its rows (`PAPER_ROWS` label -> percent);
            a benchmark split has one for every paper row.
        videos_of: the split whose videos and rows it shares, if any (videomme_wsub: videomme).
    """

    name: str
    layout: BenchmarkLayout
    row_format: str
    column: str | None
    paper: Mapping[str, float] = field(default_factory=dict)
    videos_of: str | None = None

    @property
    def benchmark(self) -> bool:
        return self.column is not None


QWEN, PARAVT = "Qwen3-VL-8B (paper)", "ParaVT-8B (paper)"
PAPER_ROWS = (QWEN, PARAVT)  # the paper's two Table 1 rows (SPEC §6), shown beneath ours
_VIDEOMME = dict(repo_id="lmms-lab/Video-MME", annotation_file="videomme/test-00000-of-00001.parquet",
                 video_dir="data", video_archive="videos_chunked_01.zip")

# In Table 1's order (SPEC §6); the order of `config.EVAL_SPLITS` and of the report's columns.
_RECORDS = (
    EvalSplit("videomme", BenchmarkLayout("videomme", **_VIDEOMME), "videomme", "VideoMME w/o sub",
              {QWEN: 59.9, PARAVT: 62.1}),
    EvalSplit("videomme_wsub", BenchmarkLayout("videomme_wsub", **_VIDEOMME, subtitle_archive="subtitle.zip",
                                               subtitle_dir="subtitle"),
              "videomme", "VideoMME w/ sub", {QWEN: 68.4, PARAVT: 69.4}, videos_of="videomme"),
    EvalSplit("longvideobench", BenchmarkLayout("longvideobench", "longvideobench/LongVideoBench",
                                                "validation-00000-of-00001.parquet", "videos",
                                                video_archive="videos.tar.part.aa"),
              "longvideobench", "LongVideoBench", {QWEN: 52.2, PARAVT: 60.4}),
    EvalSplit("lvbench", BenchmarkLayout("lvbench", "lmms-lab/LVBench", "data/test-00000-of-00001.parquet", "videos"),
              "lvbench", "LVBench", {QWEN: 33.1, PARAVT: 39.8}),
    EvalSplit("mlvu", BenchmarkLayout("mlvu", "sy1998/MLVU_dev", "data/test-00000-of-00001.parquet", "video"),
              "mlvu", "MLVU", {QWEN: 58.3, PARAVT: 65.0}),
    EvalSplit("mmvu", BenchmarkLayout("mmvu", "yale-nlp/MMVU", "data/validation-00000-of-00001.parquet", ""),
              "mmvu", "MMVU", {QWEN: 68.0, PARAVT: 68.6}),
    EvalSplit("charades", BenchmarkLayout("charades", "lmms-lab/charades_sta", "data/test-00000-of-00001.parquet",
                                          "Charades_v1_480", video_archive="Charades_v1_480.zip"),
              "charades", "Charades-STA mIoU", {QWEN: 49.3, PARAVT: 50.1}),
    # A validation split of the miniature (not a benchmark): Video-MME-format rows on videos of
    # its own, in a repo of its own, so that drawing it (`SynthConfig.validation`) changes no byte
    # of the test splits' repos. Knobs are chosen on it; the test splits report.
    EvalSplit("videomme_val", BenchmarkLayout("videomme_val", "ParaVT/Video-MME-validation",
                                              "videomme/validation-00000-of-00001.parquet", "data",
                                              video_archive="videos_chunked_01.zip"), "videomme", None),
)

SPLITS: dict[str, EvalSplit] = {record.name: record for record in _RECORDS}
LAYOUTS: dict[str, BenchmarkLayout] = {name: record.layout for name, record in SPLITS.items()}
EVAL_SPLITS = tuple(name for name, record in SPLITS.items() if record.benchmark)
VALIDATION_SPLITS = tuple(name for name, record in SPLITS.items() if not record.benchmark)
