"""Point to point: rank 0 sends a string with tag 99, rank 1 receives and prints it.

    ringworld run -n 2 python examples/p2p.py
"""

import ringworld


def main() -> None:
    comm = ringworld.init()
    if comm.size < 2:
        raise SystemExit("p2p.py needs at least 2 ranks: ringworld run -n 2 python examples/p2p.py")
    if comm.rank == 0:
        comm.send_obj("Hello, there", dest=1, tag=99)
    elif comm.rank == 1:
        message = comm.recv_obj(source=0, tag=99)
        print(f"received :{message}:")
    ringworld.finalize()


if __name__ == "__main__":
    main()
