"""Package marker: the CUDA sources in this folder are installed as gpukernels.cuda_sources."""
