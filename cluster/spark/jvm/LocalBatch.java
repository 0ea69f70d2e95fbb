package streamlab;

import java.io.IOException;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.Map;

import org.apache.spark.sql.api.python.PythonSQLUtils;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection$;
import org.apache.spark.sql.catalyst.plans.logical.LocalRelation;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.execution.arrow.ArrowConverters$;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import scala.collection.immutable.Seq;

/**
 * A small batch through an analysed plan in the driver, without a Spark job: streamlab's
 * cluster/spark/local.py calls {@link #run} once per batch through py4j.
 *
 * <p>Spark turns a projection or filter over a LocalRelation into a LocalRelation of the results
 * while it optimises the plan (its ConvertToLocalRelation rule, which evaluates the expressions
 * with its interpreted evaluator), as it does for any small local data (Spark Connect's and
 * PySpark's createDataFrame below spark.sql.execution.arrow.localRelationThreshold). A Spark job
 * costs 20-50 ms of scheduling however few its rows; a batch of a few thousand rows takes a few
 * milliseconds this way. Done in one call because each py4j call is a round trip of up to a
 * millisecond on a busy TaskManager, and a byte array returned through py4j took 45 ms.
 */
public final class LocalBatch {
    private LocalBatch() {}

    /** A task thread's projections by input schema: making one costs some 10 ms a batch. */
    private static final int KEPT_PROJECTIONS = 16;
    private static final ThreadLocal<Map<StructType, UnsafeProjection>> PROJECTIONS = ThreadLocal.withInitial(
        () -> new LinkedHashMap<StructType, UnsafeProjection>(KEPT_PROJECTIONS, 0.75f, true) {
            @Override
            protected boolean removeEldestEntry(Map.Entry<StructType, UnsafeProjection> eldest) {
                return size() > KEPT_PROJECTIONS;
            }
        });

    /** Whether a value of {@code type} holds an array or a map (whose keys and values are arrays). */
    private static boolean holdsArrays(DataType type) {
        if (type instanceof ArrayType || type instanceof MapType) {
            return true;
        }
        if (type instanceof StructType) {
            for (StructField field : ((StructType) type).fields()) {
                if (holdsArrays(field.dataType())) {
                    return true;
                }
            }
        }
        return false;
    }

    /**
     * The rows of the Arrow stream file {@code in} through {@code plan}, written to {@code out} as
     * an Arrow stream. {@code plan} is an analysed plan whose nodes each have one child, down to
     * the leaf the batch takes the place of (it keeps the leaf's attributes, which the nodes above
     * refer to). Returns the rows written, or -1 (nothing written) when Spark's optimiser leaves
     * something to execute: the caller runs the plan as a Spark job.
     */
    public static long run(SparkSession session, LogicalPlan plan, String in, String out) throws IOException {
        LogicalPlan leaf = plan;
        while (leaf.children().size() == 1) {
            leaf = leaf.children().head();
        }
        if (!leaf.children().isEmpty()) {
            throw new IllegalArgumentException("not a plan of one input: " + leaf.nodeName());
        }
        SQLConf conf = session.sessionState().conf();
        String timeZone = conf.sessionLocalTimeZone();
        boolean largeVarTypes = conf.arrowUseLargeVarTypes();
        // as Dataset.collectAsArrowToPython, which the batches of a Spark job go out by
        boolean errorOnDuplicates = "legacy".equals(conf.pandasStructHandlingMode());

        scala.collection.Iterator<InternalRow> reader = ArrowConverters$.MODULE$.fromBatchIterator(
            PythonSQLUtils.readArrowStreamFromFile(in), leaf.schema(), timeZone, errorOnDuplicates,
            largeVarTypes, null);
        // The reader fills one row over and over: each is copied. A row's copy() over Arrow vectors
        // copies an array of primitives with toLongArray() & co., which fail on a null element
        // ("Value at index is null"), so a batch with an array<bigint> holding a null failed here
        // where a job ran it: a row holding arrays or maps is copied, as an UnsafeRow, by the
        // projection Spark's own scans use. Others keep copy(), which is quicker for small batches.
        StructType input = leaf.schema();
        UnsafeProjection unsafe = holdsArrays(input)
            ? PROJECTIONS.get().computeIfAbsent(input, UnsafeProjection$.MODULE$::create) : null;
        ArrayList<InternalRow> rows = new ArrayList<>();
        while (reader.hasNext()) {
            InternalRow row = reader.next();
            rows.add(unsafe == null ? row.copy() : unsafe.apply(row).copy());
        }
        LogicalPlan local = new LocalRelation(leaf.output(), BatchJob.seq(rows.toArray(new InternalRow[0])), false,
                                              scala.Option.empty());
        LogicalPlan node = BatchJob.over(plan, batch -> local);
        node.setAnalyzed();
        Dataset<?> result = Dataset.ofRows(session, node);
        LogicalPlan optimized = result.queryExecution().optimizedPlan();
        if (!(optimized instanceof LocalRelation)) {
            return -1;
        }
        Seq<InternalRow> data = ((LocalRelation) optimized).data();
        StructType schema = result.schema();
        BatchJob.writeStream(out, schema, timeZone, errorOnDuplicates, largeVarTypes,
            ArrowConverters$.MODULE$.toBatchIterator(data.iterator(), schema, conf.arrowMaxRecordsPerBatch(), timeZone,
                                                     errorOnDuplicates, largeVarTypes, null));
        return data.size();
    }
}
