import socket
import sys


def fetch_batch(server):
    return server.recv(4096)         # line 6: a data server that accepted and never answers


def train():
    server = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    for step in range(1000):
        fetch_batch(server)


train()
