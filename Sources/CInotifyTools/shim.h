#ifndef FILECOORDINATION_CINOTIFYTOOLS_SHIM_H
#define FILECOORDINATION_CINOTIFYTOOLS_SHIM_H
#include <sys/inotify.h>
#include <inotifytools/inotifytools.h>
#endif
