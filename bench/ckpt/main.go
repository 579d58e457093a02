// Command ckpt measures checkpoint upload and restore throughput of the
// agent's checkpoint store (agent/ckpt) for a 2 GiB checkpoint, against
// the file driver (a local directory) and S3 on moto_server through
// gocloud's s3blob driver (multipart) and through presigned URLs (the
// daemon-signed path). Upload is end to end: sha256 of every file,
// transfer, size check, manifest. Restore downloads into a fresh
// directory and verifies every sha256. It prints FIGURE lines (see
// bench/internal/report); `make bench` runs it through bench/run.sh.
//
// The figures are this machine's loopback: the file driver is bounded by
// the disk and hashing, moto by its Python server.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"gocloud.dev/blob"

	"github.com/fleetd/fleetd/agent/ckpt"
	_ "github.com/fleetd/fleetd/agent/ckpt/nodestores"
	"github.com/fleetd/fleetd/bench/internal/report"
	"github.com/fleetd/fleetd/providers/aws/motoserver"
)

func main() {
	size := flag.Int64("size", 2<<30, "checkpoint size in bytes")
	files := flag.Int("files", 8, "files the checkpoint is split into")
	targets := flag.String("targets", "file,s3,s3-signed", "comma-separated: file, s3 (s3blob, multipart), s3-signed (presigned URLs)")
	jsonOut := flag.String("json", "", "also write the figures to this JSON file")
	flag.Parse()
	r := report.New(os.Stdout)
	tmp, err := os.MkdirTemp("", "fleetd-bench-ckpt-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(tmp)
	src := filepath.Join(tmp, "src")
	fmt.Printf("writing a %s checkpoint in %d files under %s\n", mib(*size), *files, src)
	if err := writeCheckpoint(filepath.Join(src, ckpt.StepName(1000)), *size, *files); err != nil {
		fail(err)
	}
	ctx := context.Background()
	var moto *motoserver.Server
	for _, target := range strings.Split(*targets, ",") {
		var store ckpt.Store
		var cleanup func()
		switch target {
		case "file":
			dir := filepath.Join(tmp, "store")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				fail(err)
			}
			bs, err := ckpt.OpenBucket(ctx, "file://"+dir)
			if err != nil {
				fail(err)
			}
			store, cleanup = bs, func() { bs.Close(); os.RemoveAll(dir) }
		case "s3", "s3-signed":
			if moto == nil {
				if moto, err = motoserver.Start(ctx); err != nil {
					r.Missing("ckpt."+target+".upload", "MiB/s", report.NoTarget, 0, err.Error())
					continue
				}
				defer moto.Close()
			}
			bs, err := motoBucket(ctx, moto, "bench-"+target)
			if err != nil {
				fail(err)
			}
			store, cleanup = bs, func() { bs.Close() }
			if target == "s3-signed" {
				store = ckpt.NewSignedStore(bucketSigner{bs}, &http.Client{Transport: &http.Transport{Proxy: nil}}, "s3://bench/signed")
				store.(*ckpt.SignedStore).SendMD5 = true
			}
		default:
			fail(fmt.Errorf("unknown target %q", target))
		}
		up, down, err := measure(ctx, store, src, filepath.Join(tmp, "restore-"+target))
		cleanup()
		if err != nil {
			fmt.Printf("%s: ERROR: %v\n", target, err)
			r.Missing("ckpt."+target+".upload", "MiB/s", report.NoTarget, 0, err.Error())
			continue
		}
		fmt.Printf("%s: upload %.1f MiB/s, restore %.1f MiB/s\n", target, up, down)
		r.Info("ckpt."+target+".upload", up, "MiB/s")
		r.Info("ckpt."+target+".restore", down, "MiB/s")
	}
	failed := r.Summary("ckpt")
	if *jsonOut != "" {
		if err := r.WriteJSON(*jsonOut); err != nil {
			fail(err)
		}
	}
	if failed > 0 {
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "ckpt bench:", err)
	os.Exit(1)
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// writeCheckpoint writes step-N/ with files of pseudo-random bytes (a
// 1 MiB random block varied per MiB, so nothing compresses or dedups)
// and the COMPLETE marker last.
func writeCheckpoint(dir string, size int64, files int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	block := make([]byte, 1<<20)
	for i := range block {
		block[i] = byte(rng.Uint32())
	}
	per := size / int64(files)
	var n uint64
	for i := range files {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("shard-%02d.pt", i)))
		if err != nil {
			return err
		}
		for left := per; left > 0; left -= int64(len(block)) {
			n++
			block[0], block[1], block[2], block[3] = byte(n), byte(n>>8), byte(n>>16), byte(n>>24)
			if _, err := f.Write(block[:min(left, int64(len(block)))]); err != nil {
				f.Close()
				return err
			}
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(dir, ckpt.CompleteMarker), []byte("{}\n"), 0o644)
}

// measure uploads the checkpoint and restores it elsewhere: MiB/s of each.
func measure(ctx context.Context, store ckpt.Store, src, dst string) (float64, float64, error) {
	local, err := ckpt.LocalSteps(src)
	if err != nil || len(local) != 1 {
		return 0, 0, fmt.Errorf("the checkpoint: %v", err)
	}
	var total int64
	_ = filepath.Walk(local[0].Dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			total += fi.Size()
		}
		return nil
	})
	state, err := os.MkdirTemp("", "fleetd-bench-ckpt-state-")
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(state)
	defer os.RemoveAll(dst)
	t0 := time.Now()
	if err := ckpt.New(ckpt.Config{Dir: src, Keep: 1, StateDir: state}, store).Upload(ctx, local[0]); err != nil {
		return 0, 0, err
	}
	up := float64(total) / (1 << 20) / time.Since(t0).Seconds()
	t1 := time.Now()
	res, err := ckpt.New(ckpt.Config{Dir: dst, Keep: 1}, store).Restore(ctx)
	if err != nil {
		return 0, 0, err
	}
	if res.Step != local[0].Step || res.Local {
		return 0, 0, fmt.Errorf("restored %+v", res)
	}
	down := float64(total) / (1 << 20) / time.Since(t1).Seconds()
	return up, down, nil
}

// motoBucket creates a bucket on moto and opens it with s3blob.
func motoBucket(ctx context.Context, srv *motoserver.Server, name string) (*ckpt.BucketStore, error) {
	c := s3.NewFromConfig(srv.Config("us-east-1"), func(o *s3.Options) { o.UsePathStyle = true })
	if _, err := c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		return nil, err
	}
	os.Setenv("AWS_ACCESS_KEY_ID", motoserver.AccessKeyID)
	os.Setenv("AWS_SECRET_ACCESS_KEY", motoserver.SecretAccessKey)
	os.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	return ckpt.OpenBucket(ctx, fmt.Sprintf("s3://%s/bench?endpoint=%s&region=us-east-1&use_path_style=true", name, srv.URL()))
}

// bucketSigner signs with the bucket's driver, as the daemon does.
type bucketSigner struct{ s *ckpt.BucketStore }

func (b bucketSigner) Sign(ctx context.Context, method string, keys []string) (map[string]string, time.Time, error) {
	out := map[string]string{}
	for _, k := range keys {
		u, err := b.s.Bucket().SignedURL(ctx, k, &blob.SignedURLOptions{Method: method, Expiry: 15 * time.Minute})
		if err != nil {
			return nil, time.Time{}, err
		}
		out[k] = u
	}
	return out, time.Now().Add(15 * time.Minute), nil
}

func (b bucketSigner) List(ctx context.Context, prefix string) ([]ckpt.Object, error) {
	return b.s.List(ctx, prefix)
}

func (b bucketSigner) Delete(ctx context.Context, keys []string) error { return b.s.Delete(ctx, keys) }
