from setuptools import find_packages, setup

setup(
    name="dlio-ckpt-ext",
    version="0.1.0",
    description="Streaming LLM checkpoint workload for the DLIO I/O benchmark",
    python_requires=">=3.11",  # s3dlio 0.10 and dgen-py 0.3 require 3.11
    packages=find_packages(include=["dlio_ckpt_ext", "dlio_ckpt_ext.*"])
    + ["dlio_ckpt_ext.configs", "hydra_plugins.dlio_ckpt_ext_searchpath"],
    # configs/dlio/ stays the single source of the presets; it is installed
    # as a package so hydra finds it with pkg://dlio_ckpt_ext.configs.
    package_dir={"dlio_ckpt_ext.configs": "configs/dlio"},
    package_data={"dlio_ckpt_ext.configs": ["workload/*.yaml"]},
    entry_points={"console_scripts": [
        "dlio-ckpt-report=dlio_ckpt_ext.report.cli:main",
        "dlio-ckpt-submit=dlio_ckpt_ext.submission.submit:main",
    ]},
    install_requires=["hydra-core>=1.3", "omegaconf>=2.3", "numpy>=2", "dgen-py>=0.3", "s3dlio>=0.10", "mpi4py", "boto3",
                      "tqdm", "matplotlib"],
    # storage_options.storage_library: the frameworks' own S3 clients (torch DCP's, Megatron's,
    # Orbax's) and the fork's minio; each is imported only when chosen
    extras_require={"clients": ["s3torchconnectorclient>=1.5", "multi-storage-client>=1.3", "tensorstore>=0.1.86",
                                "minio>=7.2"]},
)
