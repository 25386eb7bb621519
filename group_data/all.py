"""Defaults for every host. Group files, the inventory and --data override them; docs/inventories.md lists every key.

pyinfra turns each module-level name here into a data key; cdna2/schemas/host-data-1.0.json says which keys
exist and what their values may be, and the deploy rejects anything else before it touches a host.
"""

# The interpreter of the Python environment that holds AITER (and vLLM) on the host: the environment provisioned.
target_python = "/opt/venv/bin/python"

# ROCm installation root on the host. Its .info/version and bin/rocminfo are read by the probe; a host whose ROCm
# comes only as a Python wheel (rocm-sdk-core) is recognised from that wheel instead.
rocm_root = "/opt/rocm"

# The tool's own directory on the host: recorded state, backups of patched files, staging areas, the run lock, the
# agent. None: the login's default, found on the host by the probe: /var/lib/cdna2 for root (or through sudo), the
# XDG state directory of an unprivileged login ($XDG_STATE_HOME/cdna2, else ~/.local/state/cdna2).
state_dir = None

# The target environment is one directory on a shared filesystem (NFS, Lustre) that several hosts of the inventory
# mount at the same path: the first host of the run in inventory order writes it (once), the others check it
# through their own mounts and smoke-test their own GPUs. Its state lives in the environment (<prefix>/.cdna2/state,
# instead of state_dir), where every node of a later allocation finds it. Set for every host that mounts it.
shared_environment = False

# Install the translated gfx90a kernel tree on gfx90a hosts.
translate_kernels = True

# Which translated kernels to install, by their MFMA wait-state audit (cdna2/kernels/hazards.py): "default" leaves
# out kernels short of gfx90a's wait states in straight-line code and lists those short only across branches;
# "strict" installs only kernels with no short edge; "permissive" installs all and says so on every report.
kernel_hazard_policy = "default"

# Pad each short MFMA edge the audit finds with exactly the missing wait states (s_nop before the consumer, the
# kernel re-assembled and proven), so kernel_hazard_policy judges kernels that are clean under LLVM's gfx90a rules.
pad_mfma_hazards = True

# Also install the kernels whose only gfx90a blocker is an int8 K=32 MFMA, each such MFMA split into two gfx90a
# K=16 MFMAs (exact, but 4x the gfx942 cycles): off until measured on an MI210.
int8_k32_split = False

# Patch AITER's and vLLM's arch gates on gfx90a hosts (the required patch sets).
apply_patches = True

# Optional patch sets to apply besides the required ones, by name (see cdna2/data/patchsets/).
optional_patch_sets: list[str] = []

# Install ROCm-matched torch, amd-aiter and vLLM from the wheel matrix, and pin triton last.
install_wheels = True

# A directory on the controller of tuned MI210 block-FP8 GEMM configs for vLLM (files named
# N=...,K=...,device_name=AMD_Instinct_MI210,dtype=fp8_w8a8,block_shape=[128,128].json); None: install none.
fp8_block_configs = None

# Wheel matrix on the controller; None means the packaged cdna2/data/wheel-matrix.yaml.
wheel_matrix = None

# A PEP 503 index to take every wheel from instead of the matrix's indexes (an operator's mirror); None: unset.
wheel_index_url = None

# A find-links directory on the host (or URL): with it pip uses no index at all (air-gapped clusters).
wheel_find_links = None

# Version pins that override the matrix for these hosts; None keeps the matrix's choice.
torch_version = None
aiter_version = None
vllm_version = None
triton_version = None

# Manage vLLM from the wheel matrix too (install it, or move it to the matrix's version). The packaged matrix offers
# no vLLM (PyPI's vLLM wheels are CUDA builds; on ROCm vLLM comes with the image or a source build): set this only
# with a wheel_matrix of your own that names a ROCm vLLM wheel, else the host fails, naming the matrix.
install_vllm = False

# Run the on-host smoke tests after provisioning. On a host the probe sees as gfx90a the GPU checks must pass: a
# GPU that cannot be used there fails them (they are "skipped" only on hosts with no GPU or another arch).
smoke_tests = True

# Run the smoke test's GPU checks. Off only for hosts whose GPU is a stand-in (the simulated lab): the GPU checks
# are then reported "skipped", and the pass recorded says it was made without them.
smoke_gpu_checks = True

# A Singularity/Apptainer image (.sif) this node runs, on a filesystem it sees, with the layer `python -m cdna2.images
# deploy` wrote beside it: verify.py then runs the smoke test (GPU checks included) inside the node's singularity or
# apptainer with that layer, instead of checking the node's own environment (docs/images.md).
sif_image = None

# Kernel families (cdna2/data/kernel-families.yaml) to keep installed although no GPU check proves them: by default a
# host whose GPU checks run withholds every family without a passing check (its code objects leave hsa/gfx90a). A
# family kept here stays "unproven" in the report of every run; a family whose check failed is withheld regardless.
smoke_keep_unproven_families = []

# Run the benchmarks (cdna2/data/bench-cases.yaml, about 2 minutes per MI210) at the end of the deploy, after its
# smoke step passed with GPU checks. Off: `pyinfra -y INVENTORY bench.py` runs them when asked.
bench_on_deploy = False

# On rollback, also reinstall the triton version recorded before the first deploy.
rollback_restore_triton = False

# The GPU arch to provision for where the probe finds no GPU: an image is built without one (inventory/images.py).
# A GPU the probe does find always wins. Only @docker/... targets take it: another host that shows no GPU with it set
# is refused (its GPU is broken or the key misplaced). None: a host without a GPU is left alone.
gpu_arch = None

# @docker image targets: the tag the deployed image gets, e.g. "local/vllm-mi210:base-cdna2"; None leaves the
# image pyinfra commits untagged (its id is in the report).
image_tag = None

# @docker image targets: the tag the image rollback.py commits gets; None leaves it untagged.
rollback_image_tag = None
