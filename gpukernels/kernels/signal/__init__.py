"""Signal processing kernels: DFT, STFT, the Hann/Hamming/Blackman windows and
MelWeightMatrix."""
