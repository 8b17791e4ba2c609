#pragma once
// A reader/writer lock that lets a waiting writer in before new readers.
// std::shared_mutex on glibc prefers readers: with four threads running
// forwards in a loop one set_value waited for over a minute (the C ABI's
// lock). Used where no user code runs while it is held: the C ABI's lock and
// a model's structure lock. Not for a lock held while user code runs that may
// wait for another thread's reader (the Python package's: a checkpoint
// function waiting for a worker's forward deadlocked behind a waiting
// writer). Not recursive: a thread must not take it shared twice while a
// writer may wait (each user counts its holds per thread and takes it once).
// glibc's writer-preferring kind needs the fix for its bug 23861 (in 2.29;
// Debian 12 has 2.36).
#include <pthread.h>

#include <cerrno>
#include <system_error>

namespace riftco_transformer {

class WriterFirstSharedMutex {
 public:
  WriterFirstSharedMutex() {
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
#ifdef __GLIBC__
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
#endif
    const int rc = pthread_rwlock_init(&lock_, &attr);
    pthread_rwlockattr_destroy(&attr);
    if (rc != 0) throw std::system_error(rc, std::generic_category(), "pthread_rwlock_init");
  }
  ~WriterFirstSharedMutex() { pthread_rwlock_destroy(&lock_); }
  WriterFirstSharedMutex(const WriterFirstSharedMutex&) = delete;
  WriterFirstSharedMutex& operator=(const WriterFirstSharedMutex&) = delete;

  void lock() { check(pthread_rwlock_wrlock(&lock_)); }
  void unlock() { pthread_rwlock_unlock(&lock_); }
  void lock_shared() {
    int rc = 0;
    while ((rc = pthread_rwlock_rdlock(&lock_)) == EAGAIN) {  // the reader count's limit: wait for a slot
    }
    check(rc);
  }
  void unlock_shared() { pthread_rwlock_unlock(&lock_); }

 private:
  static void check(int rc) {
    if (rc != 0) throw std::system_error(rc, std::generic_category(), "pthread_rwlock");
  }
  pthread_rwlock_t lock_;
};

}  // namespace riftco_transformer
