// Scores a batch of rows with H2O genmodel in one call from Python (forestflow.runtime.jvm).
// Compiled into forestflow/runtime/java/ by scripts/gen_java.py; the class file is committed, so
// running forestflow needs a JVM but no Java compiler.
package forestflow.h2o;

import hex.genmodel.GenModel;
import java.util.Arrays;

public final class BatchScorer {
    private BatchScorer() {}

    /**
     * Scores rows.length / features rows laid out one after another in {@code rows} and writes
     * each row's predsSize predictions to {@code preds} in the same order. Each row gets fresh
     * arrays, as a per-row {@code score0} call from the caller would.
     */
    public static void score(GenModel model, double[] rows, int features, double[] preds, int predsSize) {
        int n = rows.length / features;
        for (int i = 0; i < n; i++) {
            double[] row = Arrays.copyOfRange(rows, i * features, (i + 1) * features);
            double[] out = model.score0(row, new double[predsSize]);
            System.arraycopy(out, 0, preds, i * predsSize, predsSize);
        }
    }

    /** As {@link #score}, with one offset per row (the offset overload of {@code score0}). */
    public static void scoreWithOffsets(
            GenModel model, double[] rows, int features, double[] offsets, double[] preds, int predsSize) {
        int n = rows.length / features;
        for (int i = 0; i < n; i++) {
            double[] row = Arrays.copyOfRange(rows, i * features, (i + 1) * features);
            double[] out = model.score0(row, offsets[i], new double[predsSize]);
            System.arraycopy(out, 0, preds, i * predsSize, predsSize);
        }
    }
}
