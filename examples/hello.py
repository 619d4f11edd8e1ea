"""Hello, world: rank 0 greets every rank and prints their replies in rank order.

    ringworld run -n 4 python examples/hello.py
"""

import ringworld


def main() -> None:
    comm = ringworld.init()
    rank, size = comm.rank, comm.size
    if rank == 0:
        print(f"We have {size} processes.")
        for dest in range(1, size):
            comm.send_obj(f"Hello {dest}!", dest=dest, tag=0)
        for source in range(1, size):
            print(comm.recv_obj(source=source, tag=0))
    else:
        greeting = comm.recv_obj(source=0, tag=0)
        if not greeting.startswith("Hello "):
            raise RuntimeError(f"rank {rank} got an unexpected greeting: {greeting!r}")
        comm.send_obj(f"Process {rank} reporting for duty.", dest=0, tag=0)
    ringworld.finalize()


if __name__ == "__main__":
    main()
