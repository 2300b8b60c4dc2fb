# Installed as the package dlio_ckpt_ext.configs so the presets ship as package data.
