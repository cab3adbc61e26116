"""DeepSpeed plumbing shared by the SFT and RL trainers, one concern a module: starting the ranks
(`launch`), what each rank does around its steps (`rank`), the DeepSpeed settings (`ds_config`),
checkpoints (`checkpoints`) and the trained weights and their export (`weights`).

Nothing is imported here: callers name the module that holds what they use. A package, not five
sibling modules of paravt_core, so the import layers keep it one layer (pyproject.toml).
"""
