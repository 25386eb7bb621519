"""Images as deploy targets: Docker images and containers (containers.py), Singularity/Apptainer ``.sif`` images
read without a runtime (sif.py) and given a read-only gfx90a layer beside them (layer.py)."""
