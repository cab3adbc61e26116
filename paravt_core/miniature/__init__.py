"""The miniature: everything that exists only for the generated world's tiny model.

The embedded default trains a 1.5 M-parameter Qwen3-VL on a generated long-video world; for
that model to learn anything in minutes on a CPU it is first pretrained on the world
(`pretrain`: captioning and reading phases, and the rows SFT replays beside its own), and the
skills each phase should leave are measured by teacher-forced probes (`forced`,
`caption_probe`, `reading_probe`, `agent_probe`) and by the sub-agent's and
the rollouts' own behaviour (`perception`, `rollout_probe`). The reproduction's report turns its
runs into Table 2 in miniature: what was measured (`measurements`), its statistics over seeds
(`intervals`, and `inference` / `verdicts` for the findings), the Markdown (`report_tables`) and the
figure (`report_plot`), written and logged by `reproduce`. docs/miniature.md says its method and current
results; docs/log/ keeps its lab notebook.

The core packages (data, video, agent, sft, rl, eval, registry, model) never import this one
(an import-linter contract in pyproject.toml), nor do the full pipeline's flows and tasks (another);
the reproduction's own flow and tasks hand its pieces to them (e.g. the replay rows as one more SFT
shard).
"""
