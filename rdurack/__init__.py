"""rdurack: an emulated rack of SN40L-style RDU sockets."""
