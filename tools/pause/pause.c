/* The sandbox's first process for the rig's containerd nodes: holds the pod's namespaces, reaps the children that
 * are re-parented to it, and exits on SIGTERM or SIGINT. Built static (scripts/build-runtime.sh). */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction quit = {.sa_handler = stop};
    struct sigaction child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    sigaction(SIGTERM, &quit, NULL);
    sigaction(SIGINT, &quit, NULL);
    sigaction(SIGCHLD, &child, NULL);
    for (;;) pause();
}
