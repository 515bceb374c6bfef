/* The pause process: PID 1 of every pod sandbox on the real node (e2e/cluster/node.py).
 *
 * It holds the pod's namespaces open while the pod's containers come and go, reaps the
 * zombies that PID 1 inherits, and exits at once on SIGINT or SIGTERM (PID 1 ignores any
 * signal it has no handler for). Built static (`gcc -static`) so that its image needs no
 * libc: hack/image/build.sh puts it FROM scratch.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) {
  (void)sig;
  _exit(0);
}

static void on_child(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

static int handle(int sig, void (*fn)(int), int flags) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = fn;
  sa.sa_flags = flags;
  sigemptyset(&sa.sa_mask);
  return sigaction(sig, &sa, NULL);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    puts("pause (prefix-router)");
    return 0;
  }
  if (getpid() != 1) {
    fputs("pause: warning: not running as PID 1\n", stderr);
  }
  if (handle(SIGINT, on_stop, 0) || handle(SIGTERM, on_stop, 0) ||
      handle(SIGCHLD, on_child, SA_NOCLDSTOP | SA_RESTART)) {
    perror("pause: sigaction");
    return 1;
  }
  for (;;) {
    pause();
  }
}
